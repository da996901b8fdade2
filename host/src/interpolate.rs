//! `${VAR}` and `${VAR:-default}` references in configuration values,
//! replaced with the host environment's values: used by sink manifests
//! (`[config]` values, AMQP URLs), the AMQP source's URL and ingest
//! secrets.
//!
//! Owns: the reference syntax and its errors. Must never: put a value in
//! an error (errors name the variable only), or import anything of ours —
//! it is on the ground floor.

/// Why a `${...}` reference could not be replaced.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Interpolation {
    /// The variable (named) is unset or empty and the reference gives no
    /// default.
    #[error("environment variable {0} is not set")]
    Unset(String),
    /// The reference is not `${NAME}` or `${NAME:-default}`.
    #[error("{0}")]
    Invalid(String),
}

/// Replace `${VAR}` and `${VAR:-default}` with the host environment's
/// value. Errors name the variable (never a value).
pub fn interpolate(value: &str) -> Result<String, String> {
    interpolate_checked(value).map_err(|e| e.to_string())
}

/// [`interpolate`], its error typed (the manifest tells an unset variable
/// apart).
pub(crate) fn interpolate_checked(value: &str) -> Result<String, Interpolation> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| Interpolation::Invalid("unclosed ${ reference".into()))?;
        let reference = &after[..end];
        let (var, default) = match reference.split_once(":-") {
            Some((v, d)) => (v, Some(d)),
            None => (reference, None),
        };
        if var.is_empty() || !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(Interpolation::Invalid(format!(
                "${{{reference}}} is not a valid environment variable reference"
            )));
        }
        match (std::env::var(var), default) {
            (Ok(v), _) if !v.is_empty() => out.push_str(&v),
            (_, Some(d)) => out.push_str(d),
            _ => return Err(Interpolation::Unset(var.to_string())),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
