//! JSON as JavaScript writes it: [`parse`] reads a document as `JSON.parse`
//! does, and the writers produce the bytes `JSON.stringify` produces for
//! the parsed value (ECMA-262 §25.5.2, `JSON.stringify` with no replacer or
//! indent). Receivers of the awareness service may re-serialize the parsed
//! body before they verify its signature, so the bytes must agree.
//!
//! Where JavaScript and a plain serde_json round trip differ, JavaScript's
//! rule is kept:
//!
//! - Every number is a double (`JSON.parse`): integers beyond 2^53 round to
//!   the nearest double, `-0` becomes `0`, a number beyond the double range
//!   is infinite and written `null`.
//! - Numbers are written by `Number::toString` (ECMA-262 §6.1.6.1.20): the
//!   shortest digits that read back to the same double, plain up to 21
//!   integer digits (`1e20` is `100000000000000000000`, `1e21` is `1e+21`),
//!   `0.000001` plain and `1e-7` exponential, never a trailing `.0`.
//! - Object keys that are array indices (canonical decimal integers up to
//!   2^32 − 2) come first, in ascending numeric order; the other keys keep
//!   document order; a repeated key keeps its first place and its last
//!   value.
//! - Strings escape `"`, `\`, and U+0000..U+001F only (`\b \t \n \f \r`,
//!   others `\u00xx` in lower-case hex); everything else, U+2028, U+2029
//!   and U+007F included, is written as is.
//!
//! One difference is refused instead of imitated: a lone surrogate escape
//! (`"\ud800"`), which JavaScript keeps and a Rust string cannot hold, is a
//! parse error, and so the event is rejected with that reason.

use serde_json::Value;

/// Largest array index (2^32 − 2, ECMA-262 §6.1.7).
const MAX_ARRAY_INDEX: u64 = 4_294_967_294;

/// Parses `bytes` as one JSON document. `Err` is serde_json's message
/// (position, not content).
pub fn parse(bytes: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(bytes).map_err(|err| err.to_string())
}

/// `JSON.stringify(value)` as bytes.
pub fn to_vec(value: &Value) -> Vec<u8> {
    let mut out = String::new();
    write_value(&mut out, value);
    out.into_bytes()
}

/// A JSON object written key by key, in the order the calls come.
#[derive(Debug, Default)]
pub struct Object {
    out: String,
}

impl Object {
    pub fn new() -> Object {
        Object::default()
    }

    /// An object whose text will take about `bytes`: written without
    /// growing it again and again.
    pub fn with_capacity(bytes: usize) -> Object {
        Object {
            out: String::with_capacity(bytes),
        }
    }

    fn key(&mut self, key: &str) {
        self.out.push(if self.out.is_empty() { '{' } else { ',' });
        write_string(&mut self.out, key);
        self.out.push(':');
    }

    /// `"key":"value"`.
    pub fn string(&mut self, key: &str, value: &str) {
        self.key(key);
        write_string(&mut self.out, value);
    }

    /// `"key":"value"`, or `"key":null` when absent.
    pub fn optional(&mut self, key: &str, value: Option<&str>) {
        match value {
            Some(value) => self.string(key, value),
            None => {
                self.key(key);
                self.out.push_str("null");
            }
        }
    }

    /// `"key":<value as JSON.stringify writes it>`.
    pub fn value(&mut self, key: &str, value: &Value) {
        self.key(key);
        write_value(&mut self.out, value);
    }

    /// `"key":<decimal integer>`, exact.
    pub fn integer(&mut self, key: &str, value: u64) {
        self.key(key);
        write_digits(&mut self.out, value);
    }

    /// The object's bytes.
    pub fn finish(mut self) -> Vec<u8> {
        if self.out.is_empty() {
            self.out.push('{');
        }
        self.out.push('}');
        self.out.into_bytes()
    }
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => match n.as_i64() {
            Some(i) if i.unsigned_abs() <= MAX_EXACT_INTEGER => write_integer(out, i),
            _ => write_number(out, n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut indexed: Vec<(u64, &String, &Value)> = map
                .iter()
                .filter_map(|(k, v)| array_index(k).map(|i| (i, k, v)))
                .collect();
            indexed.sort_by_key(|(i, _, _)| *i);
            let named = map.iter().filter(|(k, _)| array_index(k).is_none());
            out.push('{');
            let entries = indexed.into_iter().map(|(_, k, v)| (k, v)).chain(named);
            for (i, (key, item)) in entries.enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

/// The key as an array index, when it is one: `0`, or digits without a
/// leading zero up to [`MAX_ARRAY_INDEX`].
fn array_index(key: &str) -> Option<u64> {
    let canonical = key == "0"
        || (!key.is_empty()
            && key.len() <= 10
            && !key.starts_with('0')
            && key.bytes().all(|b| b.is_ascii_digit()));
    if !canonical {
        return None;
    }
    key.parse::<u64>().ok().filter(|i| *i <= MAX_ARRAY_INDEX)
}

/// `JSON.stringify` of a string (ECMA-262 §25.5.2.3 QuoteJSONString).
/// Runs that need no escape are found eight bytes at a time
/// ([`needs_escape`]) and copied whole: every byte to escape is ASCII, and
/// no byte of a multi-byte UTF-8 character is, so the runs end on
/// character boundaries.
fn write_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push('"');
    let (mut run, mut at) = (0, 0);
    while at < bytes.len() {
        if let Some(word) = bytes[at..].first_chunk::<8>() {
            if !needs_escape(u64::from_le_bytes(*word)) {
                at += 8;
                continue;
            }
        }
        let byte = bytes[at];
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            0x0c => "\\f",
            b'\r' => "\\r",
            0x00..=0x1f => "",
            _ => {
                at += 1;
                continue;
            }
        };
        out.push_str(&s[run..at]);
        if escape.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        } else {
            out.push_str(escape);
        }
        at += 1;
        run = at;
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Whether any of the eight bytes of `word` is one a JSON string escapes:
/// a control character (below 0x20), `"` or `\`. The word-at-a-time tests
/// "has a byte less than n" and "has a zero byte" of Sean Anderson's Bit
/// Twiddling Hacks; bytes from 0x80 (UTF-8 beyond ASCII) never match.
fn needs_escape(word: u64) -> bool {
    const ONES: u64 = u64::MAX / 255;
    const HIGHS: u64 = ONES * 0x80;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS != 0;
    let has_control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS != 0;
    has_control
        || has_zero(word ^ (ONES * u64::from(b'"')))
        || has_zero(word ^ (ONES * u64::from(b'\\')))
}

/// Largest integer every double below it holds exactly (2^53,
/// ECMA-262 §6.1.6.1): up to it an integer token reads back as itself.
const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// `JSON.stringify` of an integer a double holds exactly (|i| ≤ 2^53):
/// its decimal digits, as `Number::toString` writes every integer below
/// 10^21 — what [`write_number`] gives for it, without formatting the
/// double and cutting its digits apart.
fn write_integer(out: &mut String, i: i64) {
    if i < 0 {
        out.push('-');
    }
    write_digits(out, i.unsigned_abs());
}

/// The decimal digits of `n`, exact.
fn write_digits(out: &mut String, n: u64) {
    let mut rest = n;
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for &digit in &digits[at..] {
        out.push(char::from(digit));
    }
}

/// `JSON.stringify` of a number: `null` when not finite, else
/// `Number::toString` (ECMA-262 §6.1.6.1.20) of the shortest round-trip
/// digits, which Rust's `{:e}` gives.
fn write_number(out: &mut String, x: f64) {
    if !x.is_finite() {
        out.push_str("null");
        return;
    }
    if x == 0.0 {
        // Both zeros: JSON.stringify(-0) is "0".
        out.push('0');
        return;
    }
    if x < 0.0 {
        out.push('-');
    }
    let shortest = format!("{:e}", x.abs());
    let (mantissa, exponent) = shortest.split_once('e').unwrap_or((shortest.as_str(), "0"));
    let exponent: i64 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let digits = digits.trim_end_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    // x = 0.d1 d2 … dk × 10^n
    let k = digits.len() as i64;
    let n = exponent + 1;
    if k <= n && n <= 21 {
        out.push_str(digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(n as usize);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(digits);
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        out.push('e');
        out.push(if n > 0 { '+' } else { '-' });
        out.push_str(&(n - 1).abs().to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(json: &str) -> String {
        String::from_utf8(to_vec(&parse(json.as_bytes()).unwrap())).unwrap()
    }

    /// Pairs of (input, what node's `JSON.stringify(JSON.parse(input))`
    /// writes), taken from Node.js 20.
    const NUMBERS: &[(&str, &str)] = &[
        ("0", "0"),
        ("-0", "0"),
        ("1.0", "1"),
        ("1.50", "1.5"),
        ("-12", "-12"),
        ("0.1", "0.1"),
        ("1e2", "100"),
        ("1E+2", "100"),
        ("123456789012345678901234", "1.2345678901234569e+23"),
        ("100000000000000000000", "100000000000000000000"),
        ("1e21", "1e+21"),
        ("123456789012345680000", "123456789012345680000"),
        ("9007199254740993", "9007199254740992"),
        ("18446744073709551615", "18446744073709552000"),
        ("0.000001", "0.000001"),
        ("0.0000001", "1e-7"),
        ("1.5e-7", "1.5e-7"),
        ("5e-324", "5e-324"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("1e400", "null"),
        ("0.1e1", "1"),
        ("3.14159", "3.14159"),
        ("-2.5e-10", "-2.5e-10"),
        ("123.456e5", "12345600"),
    ];

    #[test]
    fn numbers_as_javascript_writes_them() {
        for (input, js) in NUMBERS {
            assert_eq!(
                round_trip(input),
                *js,
                "JSON.stringify(JSON.parse({input:?}))"
            );
        }
    }

    #[test]
    fn integers_are_written_as_their_double_would_be() {
        let exact = MAX_EXACT_INTEGER as i64;
        let mut integers = vec![0, 1, 9, 10, 99, 100, 12_345, i64::MAX, i64::MIN];
        for edge in [exact - 1, exact, exact + 1, exact + 2, 1 << 60] {
            integers.extend([edge, -edge]);
        }
        integers.extend((0..63).map(|shift| 3_i64 << shift.min(61)));
        for i in integers {
            let mut through_value = String::new();
            write_value(&mut through_value, &Value::from(i));
            let mut through_double = String::new();
            write_number(&mut through_double, i as f64);
            assert_eq!(through_value, through_double, "{i}");
        }
        assert_eq!(round_trip("[-0, 9007199254740993]"), "[0,9007199254740992]");
    }

    #[test]
    fn strings_escape_what_javascript_escapes() {
        assert_eq!(
            round_trip(r#""a\"b\\c\/d\u0000\u001f\b\f\n\r\t\u007f\u2028\u00e9€😀""#),
            "\"a\\\"b\\\\c/d\\u0000\\u001f\\b\\f\\n\\r\\t\u{7f}\u{2028}é€😀\""
        );
        assert_eq!(round_trip(r#""\ud83d\ude00""#), "\"😀\"");
        assert!(
            parse(br#""\ud800""#).is_err(),
            "a lone surrogate is refused"
        );
    }

    #[test]
    fn keys_in_javascript_property_order() {
        assert_eq!(
            round_trip(r#"{"b":1,"10":2,"a":3,"2":4,"01":5,"4294967295":6,"4294967294":7,"-1":8}"#),
            r#"{"2":4,"10":2,"4294967294":7,"b":1,"a":3,"01":5,"4294967295":6,"-1":8}"#
        );
        // A repeated key keeps its first place and its last value.
        assert_eq!(round_trip(r#"{"a":1,"b":2,"a":3}"#), r#"{"a":3,"b":2}"#);
        assert_eq!(
            round_trip(r#" { "n" : [ 1 , { } , [ ] , "x" ] , "__proto__" : null } "#),
            r#"{"n":[1,{},[],"x"],"__proto__":null}"#
        );
    }

    #[test]
    fn object_builder_writes_keys_in_call_order() {
        let mut o = Object::new();
        o.string("z", "é\n");
        o.optional("y", None);
        o.integer("x", u64::MAX);
        o.value("w", &parse(b"[1.0]").unwrap());
        assert_eq!(
            String::from_utf8(o.finish()).unwrap(),
            r#"{"z":"é\n","y":null,"x":18446744073709551615,"w":[1]}"#
        );
        assert_eq!(Object::new().finish(), b"{}");
    }

    #[test]
    fn a_word_needs_escaping_exactly_when_one_of_its_bytes_does() {
        let escaped = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
        for background in [b'a', 0x80, 0xff, b' ', b'!', b'#', b'[', b']'] {
            for at in 0..8 {
                for byte in 0..=255u8 {
                    let mut word = [background; 8];
                    word[at] = byte;
                    assert_eq!(
                        needs_escape(u64::from_le_bytes(word)),
                        escaped(byte) || escaped(background),
                        "{word:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn strings_are_escaped_wherever_the_escapes_fall_in_a_word() {
        // The character-by-character QuoteJSONString, to compare with.
        let quoted = |s: &str| {
            let mut out = String::from('"');
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\u{8}' => out.push_str("\\b"),
                    '\t' => out.push_str("\\t"),
                    '\n' => out.push_str("\\n"),
                    '\u{c}' => out.push_str("\\f"),
                    '\r' => out.push_str("\\r"),
                    c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        };
        for special in ["\"", "\\", "\n", "\u{1}", "\u{1f}", "é", "😀"] {
            for at in 0..20 {
                let s = format!("{}{special}{}", "x".repeat(at), "y".repeat(19 - at));
                let mut out = String::new();
                write_string(&mut out, &s);
                assert_eq!(out, quoted(&s), "{s:?}");
            }
        }
    }
}
