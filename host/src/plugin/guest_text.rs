//! Text a guest hands the host: log messages, `retry` and `reject` reasons,
//! `init` refusals.
//!
//! Owns: the one rule every guest-supplied string passes before the host
//! logs, stores or shows it — control characters escaped, so one guest
//! string is at most one log line and cannot move a terminal's cursor, and
//! the length capped, with the cut marked. The caps are defined here, once.
//!
//! Escaped: C0 controls (`\n`, `\r`, `\t` by name, the others as `\u{1b}`),
//! DEL, the C1 controls (U+0080–U+009F, NEL among them), the Unicode line
//! and paragraph separators (U+2028, U+2029) and the bidirectional
//! overrides and isolates (U+202A–U+202E, U+2066–U+2069, which reorder what
//! a reader sees). Backslashes are kept as they are: a guest that writes
//! `\n` as two characters still writes one line.
//!
//! Must never: hand on a guest string that was not passed through
//! [`clean`]; allocate more than its cap (plus the marker) for one.

/// Most bytes of a `retry` or `reject` reason, or an `init` refusal, the host
/// keeps (logs, stores as `last_error` / the dead letter's reason, shows in
/// the admin API). A dead letter's page of 100 stays under about 100 KiB.
pub const MAX_REASON_BYTES: usize = 1024;

/// Most bytes of one `log` message the host writes.
pub const MAX_LOG_BYTES: usize = 4096;

/// Appended where a guest string was cut, naming how many bytes of the
/// escaped text were left out.
fn cut_marker(left_out: usize) -> String {
    format!("…[cut {left_out} bytes]")
}

/// `text` with control characters escaped, at most `max` bytes of escaped
/// text plus, when cut, the marker `…[cut N bytes]` naming how many bytes
/// of the escaped text were left out. Never splits a character or an
/// escape.
pub fn clean(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 32);
    let mut left_out = 0usize;
    let mut push = |piece: &str| {
        if left_out == 0 && out.len() + piece.len() <= max {
            out.push_str(piece);
        } else {
            left_out += piece.len();
        }
    };
    for ch in text.chars() {
        match ch {
            '\n' => push("\\n"),
            '\r' => push("\\r"),
            '\t' => push("\\t"),
            c if needs_escape(c) => push(&format!("\\u{{{:x}}}", c as u32)),
            c => push(c.encode_utf8(&mut [0u8; 4])),
        }
    }
    if left_out > 0 {
        out.push_str(&cut_marker(left_out));
    }
    out
}

/// Whether `c` is escaped (besides `\n`, `\r`, `\t` and `\`): see the module
/// note.
fn needs_escape(c: char) -> bool {
    let u = c as u32;
    u < 0x20
        || u == 0x7f
        || (0x80..=0x9f).contains(&u)
        || u == 0x2028
        || u == 0x2029
        || (0x202a..=0x202e).contains(&u)
        || (0x2066..=0x2069).contains(&u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_breaks_and_escapes_become_visible_text() {
        let forged =
            "ok\n2026-12-01T00:00:00Z  INFO outboxd: forged\r\x1b[2J\u{85}\u{2028}\u{202e}\\n";
        let out = clean(forged, 1000);
        assert!(!out.chars().any(|c| c.is_control()), "{out:?}");
        assert_eq!(
            out,
            "ok\\n2026-12-01T00:00:00Z  INFO outboxd: forged\\r\\u{1b}[2J\\u{85}\\u{2028}\\u{202e}\\n"
        );
    }

    #[test]
    fn long_text_is_cut_at_the_cap_and_marked() {
        let out = clean(&"é".repeat(1000), 11);
        assert_eq!(out, format!("ééééé…[cut {} bytes]", 2000 - 10));
        let newlines = clean(&"\n".repeat(4096), 10);
        assert_eq!(
            newlines,
            format!("\\n\\n\\n\\n\\n…[cut {} bytes]", 8192 - 10)
        );
        assert_eq!(clean("short", 10), "short");
    }
}
