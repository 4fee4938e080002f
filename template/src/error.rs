//! The error a render or a check returns: the CR field, the line, the cause,
//! and never a secret value.

use std::fmt;

/// What went wrong, for callers that branch on it (conditions, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The template source is larger than [`Limits::template_bytes`](crate::Limits).
    TemplateTooLarge,
    /// No longer returned: templates in Go-template syntax (`{{ .KEY }}`)
    /// are rendered with Go's semantics. Kept so the stable name
    /// `go_syntax` stays reserved.
    GoSyntax,
    /// The template does not parse.
    Syntax,
    /// The template reads a value that does not exist (an unknown secret key,
    /// a misspelt field such as `.value`).
    Undefined,
    /// The template calls a function, filter or test that does not exist.
    UnknownFunction,
    /// A helper function refused its input (bad base64, a PEM block that does
    /// not parse, a wrong PKCS#12 password, …).
    Function,
    /// The render used up its fuel, or the resource its
    /// [`Budget`](crate::Budget): too much work or too much data.
    OutOfFuel,
    /// The rendered output is larger than [`Limits::output_bytes`](crate::Limits).
    OutputTooLarge,
    /// The output is binary (not UTF-8) where text was asked for.
    BinaryOutput,
    /// Any other evaluation error (wrong types, nesting too deep, …).
    Render,
    /// The render was stopped by its [`Canceller`](crate::Canceller): the
    /// caller's deadline passed (the resource's templates are too
    /// expensive).
    Cancelled,
}

impl ErrorKind {
    /// A stable short name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::TemplateTooLarge => "template_too_large",
            ErrorKind::GoSyntax => "go_syntax",
            ErrorKind::Syntax => "syntax",
            ErrorKind::Undefined => "undefined",
            ErrorKind::UnknownFunction => "unknown_function",
            ErrorKind::Function => "function",
            ErrorKind::OutOfFuel => "out_of_fuel",
            ErrorKind::OutputTooLarge => "output_too_large",
            ErrorKind::BinaryOutput => "binary_output",
            ErrorKind::Render => "render",
            ErrorKind::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A template that could not be checked or rendered.
///
/// `Display` gives `FIELD line N: CAUSE` (or `FIELD: CAUSE` when no line is
/// known), e.g.
/// `managedKubeSecretReferences[0].template.data.tls.crt line 3: undefined value: `FOO.Value` is undefined`.
/// The message never contains a secret value: helper errors describe their
/// input without echoing it, and engine messages are scrubbed of secret
/// values before they get here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// The CR field of the template, as the caller named it.
    pub field: String,
    /// The 1-based line in the template, when known.
    pub line: Option<usize>,
    /// The 1-based column (in characters) in that line, when known.
    pub column: Option<usize>,
    /// What went wrong.
    pub kind: ErrorKind,
    /// The cause, without the field and line.
    pub message: String,
}

impl TemplateError {
    pub(crate) fn new(
        field: &str,
        line: Option<usize>,
        kind: ErrorKind,
        message: impl Into<String>,
    ) -> Self {
        TemplateError {
            field: field.to_owned(),
            line,
            column: None,
            kind,
            message: message.into(),
        }
    }

    /// The error, with the line and column of the byte offset `pos` of
    /// `source` (the line stays when `pos` is unknown).
    pub(crate) fn at(mut self, source: &str, pos: Option<usize>) -> Self {
        if let Some(pos) = pos {
            let pos = pos.min(source.len());
            let pos = (0..=pos)
                .rev()
                .find(|p| source.is_char_boundary(*p))
                .unwrap_or(0);
            let start = source[..pos].rfind('\n').map_or(0, |i| i + 1);
            self.line = Some(source[..pos].matches('\n').count() + 1);
            self.column = Some(source[start..pos].chars().count() + 1);
        }
        self
    }
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => write!(
                f,
                "{} line {line}, column {column}: {}",
                self.field, self.message
            ),
            (Some(line), None) => write!(f, "{} line {line}: {}", self.field, self.message),
            _ => write!(f, "{}: {}", self.field, self.message),
        }
    }
}

impl std::error::Error for TemplateError {}
