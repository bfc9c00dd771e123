//! Test support: real redis-server processes.
