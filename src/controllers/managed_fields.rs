//! Cutting `metadata.managedFields` out of an object's JSON before it is
//! decoded. No controller reads managed fields, they are often larger than
//! the rest of the object, and decoding them (into maps of JSON values) is
//! most of the cost of decoding a watched object: at 10,000 resources, a
//! page of a list held several MiB of them at once. The cut walks the JSON
//! text only as far as the top-level `metadata` object's members, skipping
//! values without decoding them; anything it does not expect leaves the text
//! as it was (the decoder then sees the managed fields, as before).

use std::borrow::Cow;

/// `json` without `metadata.managedFields` (unchanged when it has none, or
/// is not an object the walk understands).
pub fn without_managed_fields(json: &str) -> Cow<'_, str> {
    match managed_fields_span(json.as_bytes()) {
        Some((start, end)) => {
            let mut out = String::with_capacity(json.len() - (end - start));
            out.push_str(&json[..start]);
            out.push_str(&json[end..]);
            Cow::Owned(out)
        }
        None => Cow::Borrowed(json),
    }
}

/// The bytes to remove: the `managedFields` member of the top-level
/// `metadata` object and one comma next to it.
fn managed_fields_span(b: &[u8]) -> Option<(usize, usize)> {
    let top = skip_ws(b, 0);
    if b.get(top) != Some(&b'{') {
        return None;
    }
    let (_, metadata) = find_member(b, top, b"metadata")?;
    if b.get(metadata) != Some(&b'{') {
        return None;
    }
    let (key, value) = find_member(b, metadata, b"managedFields")?;
    let end = skip_value(b, value)?;
    let after = skip_ws(b, end);
    match b.get(after)? {
        // Not the last member: take the comma after it.
        b',' => Some((key, skip_ws(b, after + 1))),
        // The last member: take the comma before it, if any.
        b'}' => {
            let before = b[..key].iter().rposition(|c| !c.is_ascii_whitespace())?;
            if b[before] == b',' {
                Some((before, end))
            } else {
                Some((key, end))
            }
        }
        _ => None,
    }
}

/// In the object starting at `object` (its `{`), the member `name`: where
/// its key starts and where its value starts.
fn find_member(b: &[u8], object: usize, name: &[u8]) -> Option<(usize, usize)> {
    let mut i = skip_ws(b, object + 1);
    loop {
        if *b.get(i)? != b'"' {
            return None;
        }
        let key_end = skip_string(b, i)?;
        let key = &b[i + 1..key_end - 1];
        let colon = skip_ws(b, key_end);
        if *b.get(colon)? != b':' {
            return None;
        }
        let value = skip_ws(b, colon + 1);
        if key == name {
            return Some((i, value));
        }
        let next = skip_ws(b, skip_value(b, value)?);
        match b.get(next)? {
            b',' => i = skip_ws(b, next + 1),
            _ => return None,
        }
    }
}

/// Past the string starting at `i` (its opening quote).
fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// Past the value starting at `i`.
fn skip_value(b: &[u8], mut i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            while i < b.len() {
                match b[i] {
                    b'"' => {
                        i = skip_string(b, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        // A number, `true`, `false` or `null`.
        _ => {
            while i < b.len() && !matches!(b[i], b',' | b'}' | b']') && !b[i].is_ascii_whitespace()
            {
                i += 1;
            }
            Some(i)
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The cut gives valid JSON equal to the object without the member.
    fn check(object: Value, text: &str) {
        let cut = without_managed_fields(text);
        let parsed: Value = serde_json::from_str(&cut).unwrap_or_else(|e| panic!("{e}: {cut}"));
        let mut expected = object;
        if let Some(m) = expected["metadata"].as_object_mut() {
            m.remove("managedFields");
        }
        assert_eq!(parsed, expected, "{cut}");
    }

    fn managed() -> Value {
        json!([{"manager": "kms-operator", "operation": "Apply",
                "fieldsV1": {"f:status": {"f:conditions": {}}, "f:x\"y": {}},
                "time": "2026-12-04T10:00:00Z"}])
    }

    #[test]
    fn the_member_goes_wherever_it_stands() {
        let orders: [&[&str]; 4] = [
            &["name", "managedFields", "labels"],
            &["managedFields", "name"],
            &["name", "labels", "managedFields"],
            &["managedFields"],
        ];
        for order in orders {
            let mut meta = serde_json::Map::new();
            for k in order {
                let v = match *k {
                    "managedFields" => managed(),
                    "labels" => json!({"a": "b"}),
                    _ => json!("app"),
                };
                meta.insert((*k).to_owned(), v);
            }
            let object = json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta,
                                "data": {"k": "dg=="}});
            // Compact, as the API server sends it, and spaced out.
            check(object.clone(), &serde_json::to_string(&object).unwrap());
            check(
                object.clone(),
                &serde_json::to_string_pretty(&object).unwrap(),
            );
            assert!(!without_managed_fields(&object.to_string()).contains("fieldsV1"));
        }
    }

    #[test]
    fn only_the_top_level_metadata_loses_it() {
        // In a label value, in the spec, in a string that looks like it.
        let object = json!({
            "kind": "KmsSecret",
            "metadata": {"name": "a", "annotations": {"note": "\"managedFields\": [1]"},
                         "managedFields": managed(), "resourceVersion": "7"},
            "spec": {"metadata": {"managedFields": [1]}, "managedFields": true},
            "status": {"count": -1.5e3, "ok": null}
        });
        let text = object.to_string();
        check(object, &text);
        let cut = without_managed_fields(&text);
        assert!(
            cut.contains(r#""spec":{"managedFields":true,"metadata":{"managedFields":[1]}}"#),
            "{cut}"
        );
    }

    #[test]
    fn anything_unexpected_is_left_as_it_was() {
        for text in [
            "",
            "[1,2]",
            r#"{"metadata": "none"}"#,
            r#"{"metadata": {"name": "a"}}"#,
            r#"{"kind": "X"}"#,
            r#"{"metadata": {"managedFields": [1, 2"#,
            r#"{"metadata": {"name" "a", "managedFields": []}}"#,
            r#"{"metadata": {"name": "unterminated}"#,
        ] {
            assert!(
                matches!(without_managed_fields(text), Cow::Borrowed(t) if t == text),
                "{text}"
            );
        }
    }
}
