//! outboxd's benchmark programs live in `examples/` of this crate (one
//! program each; `bench/run.py` builds them with `cargo build -p
//! outboxd-bench --example NAME` and runs them from
//! `target/<profile>/examples/`); this library is empty. The raw-SQL
//! ceilings (`raw_sql_ceiling`, `raw_sqlite_ceiling`, `position_ceiling`)
//! are still examples of the `outboxd` crate, in `host/examples/`.
