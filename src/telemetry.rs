//! Logging set-up: `tracing` with JSON or text output and an `EnvFilter`.
//!
//! Every record is one line whatever its fields hold: JSON escapes by
//! itself, and the text output goes through [`OneLine`], which escapes
//! line breaks and other control characters inside a record (a value a
//! tenant controls — a template's message, a KMS error — cannot forge a
//! log line).

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Output format of the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// Install the global subscriber. `level` is an `EnvFilter` directive such as
/// `info` or `kms_operator=debug,kube=info`; `RUST_LOG` overrides it.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(OneLine(std::io::stderr)),
            )
            .try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = result;
}

/// A writer of text records that keeps each record on one line: a line
/// break, carriage return or other control character inside the record is
/// written escaped (`\n`, `\r`, `\u{1b}`…); the record's own final
/// newline is kept. (The formatter writes each record with one write.)
#[derive(Clone, Copy)]
pub struct OneLine<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for OneLine<M> {
    type Writer = Escaping<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        Escaping(self.0.make_writer())
    }
}

/// See [`OneLine`].
pub struct Escaping<W>(W);

/// `record` with its inner control characters escaped; the escapes of
/// colours (ESC `[` … `m`) are kept, as the formatter writes them only to
/// a terminal.
pub fn escape_record(record: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let (body, end) = match record.strip_suffix(b"\n") {
        Some(body) => (body, &b"\n"[..]),
        None => (record, &b""[..]),
    };
    let is_plain = |b: u8| b >= 0x20 && b != 0x7f || b == b'\t';
    if body.iter().all(|&b| is_plain(b) || b == 0x1b) {
        return std::borrow::Cow::Borrowed(record);
    }
    let mut out = Vec::with_capacity(record.len() + 16);
    for (i, &b) in body.iter().enumerate() {
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0x1b if body.get(i + 1) == Some(&b'[') => out.push(b),
            b if is_plain(b) => out.push(b),
            b => out.extend_from_slice(format!("\\u{{{b:x}}}").as_bytes()),
        }
    }
    out.extend_from_slice(end);
    std::borrow::Cow::Owned(out)
}

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(&escape_record(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::escape_record;

    #[test]
    fn a_record_stays_one_line() {
        let forged = b"WARN reconcile failed error=x\n2026-01-01T00:00:00Z  INFO forged line\n";
        let out = escape_record(forged);
        let text = std::str::from_utf8(&out).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert!(text.ends_with('\n'));
        assert!(text.contains("error=x\\n2026"), "{text}");
        assert_eq!(
            &*escape_record(b"a\rb\x07c\n"),
            b"a\\rb\\u{7}c\n".as_slice()
        );
        // Plain records and colours pass unchanged.
        let plain = b"\x1b[2m2026\x1b[0m INFO ok key=value\ttab\n";
        assert_eq!(&*escape_record(plain), plain.as_slice());
    }
}
