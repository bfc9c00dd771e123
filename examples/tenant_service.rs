//! A multi-tenant billing service: each tenant's invoice numbers must be unique and
//! gapless, and two replicas of the service issue invoices at the same time.
//!
//! The method locks per tenant with `manager = self.locks` and `<self.tenant>` in the
//! key, so tenants never wait for each other; the ledger (a stand-in for the database)
//! also checks the fencing token the lock hands out (`guard = lock`) and refuses a
//! write from a holder whose lock was superseded.
//!
//! Backend: Redis when `REDIS_URL` is set, otherwise the in-memory backend. Each replica
//! has its own `LockManager`, as separate processes would.
//!
//! ```text
//! cargo run --example tenant_service
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example tenant_service
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock::{distributed_lock, LockError, LockManager};

const TENANTS: [&str; 3] = ["acme", "globex", "initech"];
const REPLICAS: usize = 2;
const INVOICES_PER_REPLICA: u64 = 15;

#[derive(Debug)]
struct Invoice {
    number: u64,
    lock_key: String,
}

#[derive(Debug)]
enum BillingError {
    Lock(LockError),
    StaleToken { token: u64, newest: u64 },
}

impl From<LockError> for BillingError {
    fn from(e: LockError) -> Self {
        BillingError::Lock(e)
    }
}

impl fmt::Display for BillingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BillingError::Lock(_) => f.write_str("could not lock the tenant's invoice sequence"),
            BillingError::StaleToken { token, newest } => {
                write!(f, "write with fencing token {token} refused: {newest} seen")
            }
        }
    }
}

impl std::error::Error for BillingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BillingError::Lock(e) => Some(e),
            BillingError::StaleToken { .. } => None,
        }
    }
}

/// One tenant's rows.
#[derive(Default)]
struct TenantRows {
    /// `(invoice number, customer)`.
    invoices: Vec<(u64, u64)>,
    newest_token: u64,
}

/// The database every replica shares.
#[derive(Default, Clone)]
struct Ledger(Arc<Mutex<HashMap<String, TenantRows>>>);

impl Ledger {
    async fn last_number(&self, tenant: &str) -> u64 {
        let rows = self.0.lock().unwrap();
        rows.get(tenant)
            .and_then(|t| t.invoices.last().map(|&(number, _)| number))
            .unwrap_or(0)
    }

    /// Stores an invoice number, unless a newer lock holder has written already.
    async fn record(
        &self,
        tenant: &str,
        number: u64,
        customer: u64,
        token: u64,
    ) -> Result<(), BillingError> {
        let mut rows = self.0.lock().unwrap();
        let rows = rows.entry(tenant.to_owned()).or_default();
        if token <= rows.newest_token {
            return Err(BillingError::StaleToken {
                token,
                newest: rows.newest_token,
            });
        }
        rows.newest_token = token;
        rows.invoices.push((number, customer));
        Ok(())
    }
}

/// One replica's handle on one tenant.
struct Billing {
    locks: LockManager,
    tenant: String,
    ledger: Ledger,
}

impl Billing {
    /// Issues the tenant's next invoice: read the last number, render, write the next.
    /// Holds `lock:invoice_seq_{<tenant>}` meanwhile.
    #[distributed_lock(
        key = "invoice_seq_<self.tenant>",
        manager = self.locks,
        ttl = "5s",
        wait = "10s",
        guard = lock
    )]
    async fn issue_invoice(&self, customer: u64) -> Result<Invoice, BillingError> {
        let number = self.ledger.last_number(&self.tenant).await + 1;
        // Rendering the PDF: without the lock, other replicas read the same number now.
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.ledger
            .record(&self.tenant, number, customer, lock.fencing_token())
            .await?;
        Ok(Invoice {
            number,
            lock_key: lock.key().to_owned(),
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").ok();
    let ledger = Ledger::default();
    let mut tasks = Vec::new();
    for replica in 0..REPLICAS {
        let locks = match &url {
            Some(url) => LockManager::connect(url).await?,
            None => LockManager::builder().in_memory().build().await?,
        };
        if replica == 0 {
            println!("backend: {}", locks.backend_name());
        }
        for tenant in TENANTS {
            let billing = Arc::new(Billing {
                locks: locks.clone(),
                tenant: tenant.to_owned(),
                ledger: ledger.clone(),
            });
            for customer in 0..INVOICES_PER_REPLICA {
                let billing = billing.clone();
                tasks.push(tokio::spawn(async move {
                    let invoice = billing.issue_invoice(customer).await?;
                    Ok::<_, BillingError>((billing.tenant.clone(), invoice))
                }));
            }
        }
    }
    let mut keys: HashMap<String, String> = HashMap::new();
    for task in tasks {
        let (tenant, invoice) = task.await??;
        assert!(invoice.number > 0);
        keys.insert(tenant, invoice.lock_key);
    }

    let expected: Vec<u64> = (1..=REPLICAS as u64 * INVOICES_PER_REPLICA).collect();
    let rows = ledger.0.lock().unwrap();
    for tenant in TENANTS {
        let mut numbers: Vec<u64> = rows[tenant].invoices.iter().map(|&(n, _)| n).collect();
        numbers.sort_unstable();
        let ok = numbers == expected;
        println!(
            "{tenant:<8} {} invoices from {REPLICAS} replicas, numbers 1..={}: {} (lock {})",
            numbers.len(),
            expected.len(),
            if ok { "unique, no gaps" } else { "WRONG" },
            keys[tenant],
        );
        if !ok {
            return Err(format!("{tenant}: {numbers:?}").into());
        }
    }
    Ok(())
}
