//! A script file as the library sends it.

/// `file` (one of `redlock-runtime/src/scripts/*.lua`) as the library sends it: without
/// the lines that are only a comment (`redlock-runtime/src/scripts.rs`), so that a test
/// that `SCRIPT LOAD`s it caches the very script (the same SHA1) the library calls.
///
/// ```
/// let body = redlock_testkit::lua_as_sent("-- about\nreturn 1\n");
/// assert_eq!(body, "return 1\n");
/// ```
pub fn lua_as_sent(file: &str) -> String {
    let mut body = String::with_capacity(file.len());
    for line in file.lines() {
        if !line.trim_start().starts_with("--") {
            body.push_str(line);
            body.push('\n');
        }
    }
    body
}
