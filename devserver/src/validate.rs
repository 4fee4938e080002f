//! Request checks that answer like the real server's schema validation: each
//! problem becomes an issue `{code, expected, received, path, message}` and
//! the request is refused with 401 `ValidationFailure` listing them all.
//! Also: reading query strings and JSON bodies the way the real server's
//! HTTP framework does, including its errors for bodies it cannot parse.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::errors::ApiError;
use crate::seed::normalize_path;

/// Largest request body accepted (the real server's framework default).
pub(crate) const BODY_LIMIT: usize = 1024 * 1024;

/// One problem found in a request, with its fields in the real server's
/// order (the order is part of the bytes the `ETag` hashes).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub(crate) enum Issue {
    /// A value of the wrong type, or a missing one.
    Type {
        code: &'static str,
        expected: String,
        received: &'static str,
        path: Vec<Value>,
        message: String,
    },
    /// A string outside a set of options.
    Enum {
        received: String,
        code: &'static str,
        options: Vec<String>,
        path: Vec<Value>,
        message: String,
    },
    /// An array longer than allowed.
    TooBig {
        code: &'static str,
        maximum: u32,
        #[serde(rename = "type")]
        kind: &'static str,
        inclusive: bool,
        exact: bool,
        message: String,
        path: Vec<Value>,
    },
    /// An empty string or array where one is needed.
    TooSmall {
        code: &'static str,
        minimum: u32,
        #[serde(rename = "type")]
        kind: &'static str,
        inclusive: bool,
        exact: bool,
        message: &'static str,
        path: Vec<Value>,
    },
}

/// The query string as an object: a value per key, an array for a key given
/// more than once.
pub(crate) fn query_object(query: Option<&str>) -> Value {
    let mut map = Map::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (decode_component(k), decode_component(v));
        match map.get_mut(&k) {
            None => {
                map.insert(k, Value::String(v));
            }
            Some(Value::Array(list)) => list.push(Value::String(v)),
            Some(existing) => {
                let first = existing.take();
                *existing = Value::Array(vec![first, Value::String(v)]);
            }
        }
    }
    Value::Object(map)
}

/// Percent-decoding of a query component (`+` is a space); invalid escapes
/// are kept as written and invalid UTF-8 is replaced.
fn decode_component(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Read a request body as the real server's framework does: JSON when the
/// content type says so, nothing when there is no body, and its errors for
/// oversized, empty, malformed or unsupported bodies.
pub(crate) async fn read_json(headers: &HeaderMap, body: Body) -> Result<Option<Value>, ApiError> {
    let too_large = || {
        ApiError::framework(
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("FST_ERR_CTP_BODY_TOO_LARGE"),
            "Request body is too large",
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .map_err(|_| too_large())?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let Some(content_type) = content_type else {
        if bytes.is_empty() {
            return Ok(None);
        }
        return Err(ApiError::framework(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("FST_ERR_CTP_INVALID_MEDIA_TYPE"),
            "Unsupported Media Type: undefined",
        ));
    };
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.ends_with("+json") {
        if bytes.is_empty() {
            return Err(ApiError::framework(
                StatusCode::BAD_REQUEST,
                Some("FST_ERR_CTP_EMPTY_JSON_BODY"),
                "Body cannot be empty when content-type is set to 'application/json'",
            ));
        }
        return match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => Ok(Some(v)),
            Err(e) => Err(ApiError::framework(
                StatusCode::BAD_REQUEST,
                None,
                format!(
                    "Unexpected token in JSON at position {}",
                    error_offset(&bytes, &e)
                ),
            )),
        };
    }
    if essence == "text/plain" {
        return Ok(Some(Value::String(
            String::from_utf8_lossy(&bytes).into_owned(),
        )));
    }
    Err(ApiError::framework(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Some("FST_ERR_CTP_INVALID_MEDIA_TYPE"),
        format!("Unsupported Media Type: {content_type}"),
    ))
}

/// The byte offset of a JSON syntax error.
fn error_offset(bytes: &[u8], e: &serde_json::Error) -> usize {
    let (line, column) = (e.line(), e.column());
    let mut offset = 0;
    for (i, l) in bytes.split(|b| *b == b'\n').enumerate() {
        if i + 1 == line {
            return offset + column.saturating_sub(1).min(l.len());
        }
        offset += l.len() + 1;
    }
    bytes.len()
}

/// The schema type name of a value, as the real server's validator says it.
fn type_name(v: Option<&Value>) -> &'static str {
    match v {
        None => "undefined",
        Some(Value::Null) => "null",
        Some(Value::Bool(_)) => "boolean",
        Some(Value::Number(_)) => "number",
        Some(Value::String(_)) => "string",
        Some(Value::Array(_)) => "array",
        Some(Value::Object(_)) => "object",
    }
}

/// The fields of a request object being checked, and the issues found.
pub(crate) struct Fields<'a> {
    obj: Option<&'a Map<String, Value>>,
    base: Vec<Value>,
    issues: Vec<Issue>,
}

impl<'a> Fields<'a> {
    /// The fields of a JSON body (or query object), which must be an object.
    pub fn of(value: Option<&'a Value>) -> Fields<'a> {
        let mut f = Fields {
            obj: None,
            base: Vec::new(),
            issues: Vec::new(),
        };
        match value {
            Some(Value::Object(map)) => f.obj = Some(map),
            other => f.type_issue(Vec::new(), "object", other),
        }
        f
    }

    /// The fields of an element nested at `path` (e.g. `["secrets", 0]`);
    /// issues are reported with that prefix. Merge back with [`Fields::absorb`].
    pub fn nested(value: &'a Value, path: Vec<Value>) -> Fields<'a> {
        let mut f = Fields {
            obj: None,
            base: path,
            issues: Vec::new(),
        };
        match value {
            Value::Object(map) => f.obj = Some(map),
            other => f.type_issue(Vec::new(), "object", Some(other)),
        }
        f
    }

    /// Take the issues of a nested check.
    pub fn absorb(&mut self, other: Fields<'_>) {
        self.issues.extend(other.issues);
    }

    fn path(&self, key: &[Value]) -> Vec<Value> {
        let mut p = self.base.clone();
        p.extend_from_slice(key);
        p
    }

    fn type_issue(&mut self, key: Vec<Value>, expected: &str, got: Option<&Value>) {
        let received = type_name(got);
        let message = if received == "undefined" {
            "Required".to_owned()
        } else {
            format!("Expected {expected}, received {received}")
        };
        let path = self.path(&key);
        self.issues.push(Issue::Type {
            code: "invalid_type",
            expected: expected.to_owned(),
            received,
            path,
            message,
        });
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.and_then(|m| m.get(key))
    }

    /// A required string.
    pub fn required_string(&mut self, key: &str) -> String {
        match self.get(key) {
            Some(Value::String(s)) => s.clone(),
            other => {
                if self.obj.is_some() {
                    self.type_issue(vec![json!(key)], "string", other);
                }
                String::new()
            }
        }
    }

    /// A required string, trimmed, at least one character.
    pub fn required_name(&mut self, key: &str) -> String {
        let present = matches!(self.get(key), Some(Value::String(_)));
        let s = self.required_string(key).trim().to_owned();
        if present && s.is_empty() {
            self.too_small(key, "string");
        }
        s
    }

    /// An optional string (absent, not null).
    pub fn optional_string(&mut self, key: &str) -> Option<String> {
        match self.get(key) {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            other => {
                self.type_issue(vec![json!(key)], "string", other);
                None
            }
        }
    }

    /// An optional string, trimmed; empty counts as absent.
    pub fn optional_trimmed(&mut self, key: &str) -> Option<String> {
        self.optional_string(key)
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    }

    /// An optional string that may also be null.
    pub fn nullable_string(&mut self, key: &str) -> Option<Option<String>> {
        match self.get(key) {
            Some(Value::Null) => Some(None),
            _ => self.optional_string(key).map(Some),
        }
    }

    /// An optional boolean that may also be null.
    pub fn nullable_bool(&mut self, key: &str) -> Option<Option<bool>> {
        match self.get(key) {
            None => None,
            Some(Value::Null) => Some(None),
            Some(Value::Bool(b)) => Some(Some(*b)),
            other => {
                self.type_issue(vec![json!(key)], "boolean", other);
                None
            }
        }
    }

    /// An optional boolean.
    pub fn optional_bool(&mut self, key: &str) -> Option<bool> {
        match self.get(key) {
            None => None,
            Some(Value::Bool(b)) => Some(*b),
            other => {
                self.type_issue(vec![json!(key)], "boolean", other);
                None
            }
        }
    }

    /// An optional non-negative whole number that may also be null.
    pub fn nullable_count(&mut self, key: &str) -> Option<Option<u64>> {
        match self.get(key) {
            None => None,
            Some(Value::Null) => Some(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) => Some(Some(v)),
                None => {
                    let path = self.path(&[json!(key)]);
                    self.issues.push(Issue::Type {
                        code: "invalid_type",
                        expected: "integer".to_owned(),
                        received: "float",
                        path,
                        message: "Expected integer, received float".to_owned(),
                    });
                    None
                }
            },
            other => {
                self.type_issue(vec![json!(key)], "number", other);
                None
            }
        }
    }

    /// A folder path, `/` when absent, normalized.
    pub fn secret_path(&mut self, key: &str) -> String {
        normalize_path(&self.optional_string(key).unwrap_or_default())
    }

    /// A query flag: the string `true` or `false`, `false` when absent.
    pub fn flag(&mut self, key: &str) -> bool {
        self.one_of(key, &["true", "false"], "false") == "true"
    }

    /// A query flag that may be absent (`None`).
    pub fn optional_flag(&mut self, key: &str) -> Option<bool> {
        self.get(key)?;
        Some(self.flag(key))
    }

    /// An optional object (absent, not null), to check with
    /// [`Fields::nested`].
    pub fn optional_object(&mut self, key: &str) -> Option<&'a Value> {
        match self.get(key) {
            None => None,
            Some(v @ Value::Object(_)) => Some(v),
            other => {
                self.type_issue(vec![json!(key)], "object", other);
                None
            }
        }
    }

    /// A required array of 1 to `max` elements.
    pub fn array_up_to(&mut self, key: &str, max: u32) -> Vec<&'a Value> {
        let list = self.non_empty_array(key);
        if list.len() > max as usize {
            let path = self.path(&[json!(key)]);
            self.issues.push(Issue::TooBig {
                code: "too_big",
                maximum: max,
                kind: "array",
                inclusive: true,
                exact: false,
                message: format!("Array must contain at most {max} element(s)"),
                path,
            });
        }
        list
    }

    /// One of `options`, `default` when absent.
    pub fn one_of(&mut self, key: &str, options: &[&str], default: &str) -> String {
        match self.get(key) {
            None => default.to_owned(),
            Some(Value::String(s)) if options.contains(&s.as_str()) => s.clone(),
            Some(Value::String(s)) => {
                let path = self.path(&[json!(key)]);
                let quoted: Vec<String> = options.iter().map(|o| format!("'{o}'")).collect();
                self.issues.push(Issue::Enum {
                    received: s.clone(),
                    code: "invalid_enum_value",
                    options: options.iter().map(|o| (*o).to_owned()).collect(),
                    path,
                    message: format!(
                        "Invalid enum value. Expected {}, received '{s}'",
                        quoted.join(" | ")
                    ),
                });
                default.to_owned()
            }
            other => {
                let expected = options
                    .iter()
                    .map(|o| format!("'{o}'"))
                    .collect::<Vec<_>>()
                    .join(" | ");
                self.type_issue(vec![json!(key)], &expected, other);
                default.to_owned()
            }
        }
    }

    /// A required array with at least one element.
    pub fn non_empty_array(&mut self, key: &str) -> Vec<&'a Value> {
        match self.get(key) {
            Some(Value::Array(list)) if !list.is_empty() => list.iter().collect(),
            Some(Value::Array(_)) => {
                self.too_small(key, "array");
                Vec::new()
            }
            other => {
                if self.obj.is_some() {
                    self.type_issue(vec![json!(key)], "array", other);
                }
                Vec::new()
            }
        }
    }

    fn too_small(&mut self, key: &str, kind: &str) {
        let path = self.path(&[json!(key)]);
        let message = if kind == "array" {
            "Array must contain at least 1 element(s)"
        } else {
            "String must contain at least 1 character(s)"
        };
        self.issues.push(Issue::TooSmall {
            code: "too_small",
            minimum: 1,
            kind: if kind == "array" { "array" } else { "string" },
            inclusive: true,
            exact: false,
            message,
            path,
        });
    }

    /// Report a problem with a path parameter.
    pub fn param_too_small(&mut self, name: &str) {
        let saved = std::mem::take(&mut self.base);
        self.too_small(name, "string");
        self.base = saved;
    }

    /// Refuse the request if any issue was found.
    pub fn finish(self) -> Result<(), ApiError> {
        if self.issues.is_empty() {
            Ok(())
        } else {
            Err(ApiError::validation(self.issues))
        }
    }
}

/// A secret value as the real server stores it: trimmed, keeping one final
/// newline if there was one.
pub(crate) fn clean_value(raw: &str) -> String {
    if raw.ends_with('\n') {
        format!("{}\n", raw.trim())
    } else {
        raw.trim().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_value_is_the_recorded_issue() {
        let body = json!({"workspaceId": "w", "environment": "dev"});
        let mut f = Fields::of(Some(&body));
        f.required_string("secretValue");
        let err = f.finish().expect_err("invalid");
        assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
        let mut f = Fields::of(Some(&body));
        f.required_string("secretValue");
        assert_eq!(
            serde_json::to_string(&f.issues).expect("json"),
            r#"[{"code":"invalid_type","expected":"string","received":"undefined","path":["secretValue"],"message":"Required"}]"#
        );
    }

    #[test]
    fn wrong_types_and_enums() {
        let body = json!({"a": 1, "b": "maybe", "c": [], "d": null});
        let mut f = Fields::of(Some(&body));
        f.required_string("a");
        f.flag("b");
        f.non_empty_array("c");
        f.optional_string("d");
        let issues = serde_json::to_value(&f.issues).expect("json");
        let messages: Vec<&str> = issues
            .as_array()
            .expect("array")
            .iter()
            .map(|i| i["message"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(
            messages,
            [
                "Expected string, received number",
                "Invalid enum value. Expected 'true' | 'false', received 'maybe'",
                "Array must contain at least 1 element(s)",
                "Expected string, received null",
            ]
        );
        let text = json!("text");
        let mut f = Fields::of(Some(&text));
        f.required_string("x");
        assert_eq!(f.issues.len(), 1);
        assert_eq!(
            serde_json::to_value(&f.issues).expect("json")[0]["path"],
            json!([])
        );
    }

    #[test]
    fn nested_paths() {
        let item = json!({"secretKey": 5});
        let empty = json!({});
        let mut f = Fields::of(Some(&empty));
        let mut n = Fields::nested(&item, vec![json!("secrets"), json!(1)]);
        n.required_string("secretKey");
        f.absorb(n);
        assert_eq!(
            serde_json::to_value(&f.issues).expect("json")[0]["path"],
            json!(["secrets", 1, "secretKey"])
        );
    }

    #[test]
    fn queries() {
        let q = query_object(Some("a=1&b=%2Fx%2Fy&a=2&c=x+y&d&e=%zz"));
        assert_eq!(q["a"], json!(["1", "2"]));
        assert_eq!(q["b"], json!("/x/y"));
        assert_eq!(q["c"], json!("x y"));
        assert_eq!(q["d"], json!(""));
        assert_eq!(q["e"], json!("%zz"));
        assert_eq!(query_object(Some("x=%4")), json!({"x": "%4"}));
    }

    #[test]
    fn values_are_cleaned() {
        assert_eq!(clean_value("  a b  "), "a b");
        assert_eq!(clean_value("line1\nline2\n"), "line1\nline2\n");
        assert_eq!(clean_value(" x \n\n"), "x\n");
    }

    #[test]
    fn error_offsets() {
        let bytes = b"{\"a\":}";
        let e = serde_json::from_slice::<Value>(bytes).expect_err("bad");
        assert_eq!(error_offset(bytes, &e), 5);
    }
}
