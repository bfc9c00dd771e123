//! Placeholders through destructuring patterns, `mut` bindings and fields.

use redlock::{distributed_lock, LockError};

pub struct User {
    pub id: u64,
    pub name: String,
}

pub struct Request {
    pub user: User,
    pub item: (u32, String),
}

pub struct Wrapper<T>(pub T);

pub struct Pair {
    pub left: u32,
    pub right: u32,
}

#[distributed_lock(key = "req_<req.user.id>_<req.item.0>")]
async fn nested_fields(req: Request) -> Result<String, LockError> {
    Ok(req.user.name)
}

#[distributed_lock(key = "pair_<a>_<b>")]
async fn tuple((a, b): (u32, String)) -> Result<String, LockError> {
    Ok(format!("{a}{b}"))
}

#[distributed_lock(key = "wrapped_<id>")]
async fn tuple_struct(Wrapper(id): Wrapper<u64>) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "struct_<left>_<r>")]
async fn struct_pattern(Pair { left, right: r }: Pair) -> Result<u32, LockError> {
    Ok(left + r)
}

#[distributed_lock(key = "nested_<id>_<name>")]
async fn nested(Wrapper(User { id, name }): Wrapper<User>) -> Result<String, LockError> {
    Ok(format!("{id}{name}"))
}

#[distributed_lock(key = "mut_<n>")]
async fn mutable(mut n: u32, mut items: Vec<u32>) -> Result<u32, LockError> {
    n += 1;
    items.push(n);
    Ok(items.iter().sum())
}

#[distributed_lock(key = "ref_<x>_<all>")]
async fn by_ref(&x: &u32, all @ Wrapper(_): Wrapper<u8>) -> Result<u32, LockError> {
    let Wrapper(inner) = all;
    Ok(x + u32::from(inner))
}

impl std::fmt::Display for Wrapper<u8> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "w{}", self.0)
    }
}

#[distributed_lock(key = "raw_<type>")]
async fn raw(r#type: &str) -> Result<usize, LockError> {
    Ok(r#type.len())
}

#[distributed_lock(key = "literal_<<_<id>")]
async fn escaped(id: u8) -> Result<u8, LockError> {
    Ok(id)
}

fn is_send<T: Send>(_: T) {}

fn main() {
    is_send(tuple((1, String::new())));
    is_send(tuple_struct(Wrapper(1)));
    is_send(struct_pattern(Pair { left: 1, right: 2 }));
    is_send(mutable(1, Vec::new()));
    is_send(by_ref(&1, Wrapper(2)));
    is_send(raw("x"));
    is_send(escaped(1));
    let _ = nested_fields;
    let _ = nested;
}
