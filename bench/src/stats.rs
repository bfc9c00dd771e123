//! Medians, spreads, percentiles and the table printer.

use std::fmt::Write as _;
use std::time::Duration;

/// One figure measured once per run.
#[derive(Debug, Clone, Default)]
pub struct Runs(pub Vec<f64>);

impl Runs {
    pub fn push(&mut self, x: f64) {
        self.0.push(x);
    }

    pub fn median(&self) -> f64 {
        median(&self.0)
    }

    /// Half the range between the lowest and the highest run, relative to the median.
    pub fn spread(&self) -> f64 {
        let m = self.median();
        if self.0.len() < 2 || m == 0.0 || !m.is_finite() {
            return 0.0;
        }
        let lo = self.0.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (hi - lo) / 2.0 / m
    }

    /// How many runs are above `x`.
    pub fn above(&self, x: f64) -> usize {
        self.0.iter().filter(|&&r| r > x).count()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `a[run] / b[run]` for every run: ratios of figures taken close together, so that slow
/// drifts of the machine cancel out; report their median.
pub fn paired(a: &Runs, b: &Runs) -> Runs {
    Runs(a.0.iter().zip(&b.0).map(|(x, y)| x / y).collect())
}

pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `q` quantile (0..=1) of durations, nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `12 345` style thousands grouping for a rounded number.
pub fn group(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let n = x.round() as i64;
    let s = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

/// A figure with its spread: `12 345 ±1.2%`.
pub fn with_spread(r: &Runs, fmt: impl Fn(f64) -> String) -> String {
    if r.is_empty() {
        return "-".into();
    }
    format!("{} ±{:.1}%", fmt(r.median()), r.spread() * 100.0)
}

pub fn fixed(digits: usize) -> impl Fn(f64) -> String {
    move |x| {
        if x.is_finite() {
            format!("{x:.digits$}")
        } else {
            "-".into()
        }
    }
}

/// A plain text table with a title, printed at once.
pub struct Table {
    title: String,
    head: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, head: &[&str]) -> Self {
        Self {
            title: title.into(),
            head: head.iter().map(|s| (*s).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// A row whose implementation could not run the scenario.
    pub fn na(&mut self, name: &str, why: &str) {
        let mut cells = vec![name.to_owned(), format!("n/a: {why}")];
        cells.resize(self.head.len(), String::new());
        self.rows.push(cells);
    }

    pub fn rows_mut(&mut self) -> &mut [Vec<String>] {
        &mut self.rows
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub fn render(&self) -> String {
        let cols = self.head.len();
        let mut width = vec![0; cols];
        for row in std::iter::once(&self.head).chain(&self.rows) {
            // An n/a row's message spans the remaining columns: it does not widen them.
            let span = row.iter().skip(1).all(String::is_empty) || is_na(row);
            for (i, cell) in row.iter().enumerate().take(cols) {
                if span && i > 0 {
                    continue;
                }
                width[i] = width[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let _ = writeln!(out, "\n== {} ==", self.title);
        let line = |cells: &[String], out: &mut String| {
            let mut s = String::new();
            for (i, cell) in cells.iter().enumerate().take(cols) {
                if i == 0 {
                    let _ = write!(s, "{cell:<w$}", w = width[0]);
                } else if is_na(cells) {
                    let _ = write!(s, "  {cell}");
                } else {
                    let _ = write!(s, "  {cell:>w$}", w = width[i]);
                }
            }
            let _ = writeln!(out, "{}", s.trim_end());
        };
        line(&self.head, &mut out);
        let total: usize = width.iter().sum::<usize>() + 2 * (cols - 1);
        let _ = writeln!(out, "{}", "-".repeat(total));
        for row in &self.rows {
            line(row, &mut out);
        }
        for n in &self.notes {
            let _ = writeln!(out, "  {n}");
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

fn is_na(row: &[String]) -> bool {
    row.get(1).is_some_and(|c| c.starts_with("n/a"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_groups() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(group(1234567.4), "1 234 567");
        assert_eq!(group(999.0), "999");
        let r = Runs(vec![90.0, 100.0, 110.0]);
        assert!((r.spread() - 0.1).abs() < 1e-9);
        let d: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(quantile(&d, 0.5), Duration::from_micros(50));
        assert_eq!(quantile(&d, 0.99), Duration::from_micros(99));
    }
}
