//! Generic functions: type and lifetime parameters, where clauses, `impl Trait`
//! in argument and return position.

use std::fmt::{Debug, Display};

use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "item_<id>", ttl = "30s")]
pub async fn generic<T, I>(id: I, value: T) -> Result<Vec<T>, LockError>
where
    T: Clone + Send + Debug,
    I: Display + Send + Sync,
{
    Ok(vec![value.clone(), value])
}

#[distributed_lock(key = "name_<name>")]
async fn borrowed<'a>(name: &'a str, items: &'a [u8]) -> Result<&'a [u8], LockError> {
    Ok(&items[..name.len().min(items.len())])
}

#[distributed_lock(key = "show_<what>")]
async fn impl_trait(what: impl Display + Send + Sync) -> Result<impl Display, LockError> {
    Ok(format!("<{what}>"))
}

#[distributed_lock(key = "iter_<n>")]
async fn impl_iter(n: u32) -> Result<impl Iterator<Item = u32> + Send, LockError> {
    Ok(0..n)
}

#[distributed_lock(key = "const_<n>")]
async fn with_const<const N: usize>(n: u8) -> Result<[u8; N], LockError> {
    Ok([n; N])
}

/// A generic impl with a where clause on the method.
pub struct Repo<T> {
    locks: redlock::LockManager,
    items: Vec<T>,
}

impl<T: Clone + Send + Sync> Repo<T> {
    #[distributed_lock(key = "repo_<index>", manager = self.locks)]
    pub async fn get<I>(&self, index: I) -> Result<Option<T>, LockError>
    where
        I: Into<usize> + Display + Copy + Send,
    {
        Ok(self.items.get(index.into()).cloned())
    }
}

fn is_send<T: Send>(_: T) {}

fn main() {
    is_send(generic(7u64, String::from("x")));
    is_send(borrowed("ab", &[1, 2, 3]));
    is_send(impl_trait(5));
    is_send(impl_iter(3));
    is_send(with_const::<4>(1));
    fn check(repo: &Repo<String>) {
        is_send(repo.get(1u8));
    }
    let _ = check;
}
