//! The seam between the store's shared code and a database: SQL written
//! once as a template, the dialect that turns it into one database's SQL,
//! and the small runner a backend provides to execute it.
//!
//! Owns: [`Dialect`] (schema prefix, placeholders, clock and time
//! expressions), [`Stmt`] with its [`Arg`]s and [`Col`]umns, the [`Sql`] /
//! [`SqlTx`] runner traits, and the one generic bind and decode every
//! backend's runner uses.
//!
//! Must never: decide anything about deliveries (that is
//! [`crate::store::plan`]), or hide a statement's cost: a template is run
//! as written, one round trip per [`Stmt`].

use async_trait::async_trait;

/// How one database spells what a template leaves open.
///
/// Templates are written with PostgreSQL's `$N` placeholders and these
/// markers: `{s}` (the schema prefix of outboxd's tables), `{now_ms}`
/// (database time, Unix ms, `bigint`), `{now}` (database time as the
/// database stores a point in time).
#[derive(Debug)]
pub struct Dialect {
    /// Prefix of outboxd's tables: `outboxd.` or empty.
    pub schema: &'static str,
    /// Database time in Unix milliseconds, as an SQL expression.
    pub now_ms: &'static str,
    /// Database time in the type the delivery tables' time columns have.
    pub now: &'static str,
    /// Placeholders are `?N` instead of `$N`.
    pub question_marks: bool,
    /// The larger of two values (`GREATEST` / two-argument `MAX`).
    pub greatest: &'static str,
    /// A delivery-table time column (`{}`) as Unix ms.
    pub time_as_ms: &'static str,
    /// A Unix-ms value (`{}`) as a delivery-table time.
    pub ms_as_time: &'static str,
    /// The database time `{}` milliseconds ago, as a delivery-table time.
    pub ms_ago: &'static str,
    /// The database time `{}` milliseconds ahead, as a delivery-table time.
    pub ms_ahead: &'static str,
    /// A statement that bounds the statements after it in a read
    /// transaction to a probe's budget, [`crate::limits::PROBE_TIMEOUT`]
    /// in ms as `{probe_ms}` (PostgreSQL `SET LOCAL statement_timeout`);
    /// `None` where statements cannot hang.
    pub probe_timeout: Option<&'static str>,
    /// The `due_at` of a head blocked by a dead letter: never.
    pub blocked_due: &'static str,
    /// Appended to a `SELECT` whose rows the transaction will change
    /// (PostgreSQL `FOR UPDATE`; empty where one writer holds the file).
    pub for_update: &'static str,
    /// Lock one stream's row (`$1`) for the transaction, taken in byte
    /// order of the streams (see [`crate::store::postgres`]); `None` where
    /// one writer holds the file.
    pub lock_stream: Option<&'static str>,
    /// Added to a read of events to skip those enqueued by SQL and not yet
    /// routed (PostgreSQL ` AND routed`); empty where every event is routed
    /// at ingest.
    pub routed_only: &'static str,
    /// A one-row, one-column query: true when no migration was ever
    /// applied (there is no `_sqlx_migrations` table).
    pub no_migrations: &'static str,
    /// A statement that wakes other processes, `$1` the payload (see
    /// [`crate::wakeups::payload`]); `None` for a store one process owns.
    pub notify: Option<&'static str>,
}

impl Dialect {
    /// `template` in this dialect's SQL.
    pub fn sql(&self, template: &str) -> String {
        let sql = template
            .replace("{s}", self.schema)
            .replace("{now_ms}", self.now_ms)
            .replace("{now}", self.now)
            .replace("{greatest}", self.greatest);
        if self.question_marks {
            sql.replace('$', "?")
        } else {
            sql
        }
    }

    /// `column` (a delivery-table time) as Unix ms.
    pub fn time_as_ms(&self, column: &str) -> String {
        self.time_as_ms.replace("{}", column)
    }

    /// The Unix-ms value `param` as a delivery-table time.
    pub fn ms_as_time(&self, param: &str) -> String {
        self.ms_as_time.replace("{}", param)
    }

    /// The database time `param` milliseconds ago.
    pub fn ms_ago(&self, param: &str) -> String {
        self.ms_ago.replace("{}", param)
    }

    /// The database time `param` milliseconds ahead.
    pub fn ms_ahead(&self, param: &str) -> String {
        self.ms_ahead.replace("{}", param)
    }

    /// The wake-up statement for `payload`, when this store has one.
    pub fn wake(&self, payload: &str) -> Option<Stmt> {
        self.notify
            .map(|sql| Stmt::new(self.sql(sql), &[]).arg(payload))
    }
}

/// A value bound to a placeholder.
#[derive(Debug, Clone)]
pub enum Arg {
    /// Text.
    Text(String),
    /// Text or NULL.
    OptText(Option<String>),
    /// A 64-bit integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl From<&str> for Arg {
    fn from(s: &str) -> Arg {
        Arg::Text(s.to_string())
    }
}
impl From<&String> for Arg {
    fn from(s: &String) -> Arg {
        Arg::Text(s.clone())
    }
}
impl From<String> for Arg {
    fn from(s: String) -> Arg {
        Arg::Text(s)
    }
}
impl From<i64> for Arg {
    fn from(n: i64) -> Arg {
        Arg::Int(n)
    }
}
impl From<bool> for Arg {
    fn from(b: bool) -> Arg {
        Arg::Bool(b)
    }
}
impl From<Option<i64>> for Arg {
    fn from(n: Option<i64>) -> Arg {
        match n {
            Some(n) => Arg::Int(n),
            None => Arg::OptText(None),
        }
    }
}

/// The type of a returned column, as [`Stmt`] decodes it. Integer columns
/// must be `bigint` (PostgreSQL) or INTEGER (SQLite): cast in the SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Col {
    /// Text, never NULL.
    Text,
    /// Text or NULL.
    OptText,
    /// A 64-bit integer, never NULL.
    Int,
    /// A 64-bit integer or NULL.
    OptInt,
    /// A boolean.
    Bool,
    /// Bytes (BLOB / `bytea`).
    Bytes,
}

/// A decoded column value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Val {
    /// Text (`None`: NULL).
    Text(Option<String>),
    /// An integer (`None`: NULL).
    Int(Option<i64>),
    /// A boolean.
    Bool(bool),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl Val {
    /// The text, or empty for NULL or another type.
    pub fn text(&self) -> String {
        match self {
            Val::Text(Some(s)) => s.clone(),
            _ => String::new(),
        }
    }
    /// The text, `None` for NULL.
    pub fn opt_text(&self) -> Option<String> {
        match self {
            Val::Text(s) => s.clone(),
            _ => None,
        }
    }
    /// The integer, 0 for NULL or another type.
    pub fn int(&self) -> i64 {
        self.opt_int().unwrap_or(0)
    }
    /// The integer, `None` for NULL.
    pub fn opt_int(&self) -> Option<i64> {
        match self {
            Val::Int(n) => *n,
            _ => None,
        }
    }
    /// True only for a true boolean.
    pub fn bool(&self) -> bool {
        matches!(self, Val::Bool(true))
    }
    /// The bytes, empty for another type.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Val::Bytes(b) => b.clone(),
            _ => Vec::new(),
        }
    }
}

/// One statement: its SQL (already in the dialect), the values of its
/// placeholders in order, and the columns it returns (empty for none).
#[derive(Debug, Clone)]
pub struct Stmt {
    /// The SQL, in the dialect already.
    pub sql: String,
    /// The placeholders' values, in order.
    pub args: Vec<Arg>,
    /// The columns it returns, in order.
    pub cols: &'static [Col],
}

impl Stmt {
    /// `sql` returning `cols`, with no values bound yet.
    pub fn new(sql: String, cols: &'static [Col]) -> Stmt {
        Stmt {
            sql,
            args: Vec::new(),
            cols,
        }
    }

    /// Bind the next placeholder.
    pub fn arg(mut self, value: impl Into<Arg>) -> Stmt {
        self.args.push(value.into());
        self
    }
}

/// Rows as a runner returns them: one `Vec<Val>` per row, in the order of
/// the statement's [`Stmt::cols`].
pub type Rows = Vec<Vec<Val>>;

/// A transaction of a backend.
#[async_trait]
pub trait SqlTx: Send {
    /// Run `stmt`, returning its rows (none for a statement without
    /// `RETURNING`/`SELECT`; count with `RETURNING 1` where a number of
    /// changed rows matters).
    async fn rows(&mut self, stmt: Stmt) -> Result<Rows, sqlx::Error>;

    /// Commit. Dropping a transaction without it rolls it back.
    async fn commit(self: Box<Self>) -> Result<(), sqlx::Error>;
}

/// What a backend provides for the store's shared code.
#[async_trait]
pub trait Sql: Send + Sync {
    /// How this database spells the shared templates.
    fn dialect(&self) -> &'static Dialect;

    /// The backend's migrations.
    fn migrator(&self) -> &'static sqlx::migrate::Migrator;

    /// Begin a transaction (SQLite: on its one writer connection).
    async fn begin(&self) -> Result<Box<dyn SqlTx + '_>, sqlx::Error>;

    /// Begin a read-only transaction (SQLite: on a reader connection).
    async fn begin_read(&self) -> Result<Box<dyn SqlTx + '_>, sqlx::Error>;

    /// Run one read (SQLite: on a reader).
    async fn read(&self, stmt: Stmt) -> Result<Rows, sqlx::Error> {
        let mut out = self.read_all(vec![stmt]).await?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Run reads in one read-only transaction, returning each one's rows.
    async fn read_all(&self, stmts: Vec<Stmt>) -> Result<Vec<Rows>, sqlx::Error> {
        run_in(self.begin_read().await?, stmts).await
    }

    /// Run `stmts` in one transaction, returning each one's rows.
    async fn write(&self, stmts: Vec<Stmt>) -> Result<Vec<Rows>, sqlx::Error> {
        run_in(self.begin().await?, stmts).await
    }
}

/// Run `stmts` in `tx` and commit it, returning each one's rows.
async fn run_in(mut tx: Box<dyn SqlTx + '_>, stmts: Vec<Stmt>) -> Result<Vec<Rows>, sqlx::Error> {
    let mut out = Vec::with_capacity(stmts.len());
    for stmt in stmts {
        out.push(tx.rows(stmt).await?);
    }
    tx.commit().await?;
    Ok(out)
}

/// Bind `args` to `query`, in order. The one place that knows how an
/// [`Arg`] becomes a database value.
pub fn bind_all<'q, DB>(
    mut query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    args: Vec<Arg>,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    DB: sqlx::Database,
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<String>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    bool: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    for arg in args {
        query = match arg {
            Arg::Text(s) => query.bind(s),
            Arg::OptText(s) => query.bind(s),
            Arg::Int(n) => query.bind(n),
            Arg::Bool(b) => query.bind(b),
        };
    }
    query
}

/// Decode `row` by `cols`.
pub fn decode<'r, R>(row: &'r R, cols: &[Col]) -> Result<Vec<Val>, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    cols.iter()
        .enumerate()
        .map(|(i, col)| {
            Ok(match col {
                Col::Text | Col::OptText => Val::Text(row.try_get(i)?),
                Col::Int | Col::OptInt => Val::Int(row.try_get(i)?),
                Col::Bool => Val::Bool(row.try_get(i)?),
                Col::Bytes => Val::Bytes(row.try_get(i)?),
            })
        })
        .collect()
}

/// Define `$name`, a transaction of database `$db` as the shared code runs
/// it ([`SqlTx`]): the one runner body, stamped out for each backend
/// (sqlx's executor bounds do not let one generic impl be written for
/// every database).
#[macro_export]
#[doc(hidden)]
macro_rules! sql_tx {
    ($name:ident, $db:ty) => {
        /// A transaction, as the shared code runs it.
        struct $name(sqlx::Transaction<'static, $db>);

        #[async_trait::async_trait]
        impl $crate::store::sql::SqlTx for $name {
            async fn rows(
                &mut self,
                stmt: $crate::store::sql::Stmt,
            ) -> Result<$crate::store::sql::Rows, sqlx::Error> {
                let query = $crate::store::sql::bind_all(sqlx::query(&stmt.sql), stmt.args);
                let rows = query.fetch_all(&mut *self.0).await?;
                rows.iter()
                    .map(|row| $crate::store::sql::decode(row, stmt.cols))
                    .collect()
            }

            async fn commit(self: Box<Self>) -> Result<(), sqlx::Error> {
                self.0.commit().await
            }
        }
    };
}
