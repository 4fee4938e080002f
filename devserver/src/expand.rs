//! Secret references: `${KEY}` names a secret of the same folder,
//! `${env.a.b.KEY}` the secret `KEY` of folder `/a/b` of environment `env`
//! (`${env.KEY}` its root). References are expanded recursively up to a
//! depth of 10; a reference to a secret that does not exist — or that the
//! reader may not read — expands to an empty string.

use crate::seed::normalize_path;
use crate::store::State;

/// Deepest chain of references followed.
const MAX_DEPTH: usize = 10;

/// Which folders (environment, path) a reader may read.
pub(crate) type Visible<'a> = &'a dyn Fn(&str, &str) -> bool;

/// Expands references within one project.
pub(crate) struct Expander<'a> {
    st: &'a State,
    project_id: &'a str,
    visible: Option<Visible<'a>>,
}

impl<'a> Expander<'a> {
    /// An expander for a project.
    pub fn new(st: &'a State, project_id: &'a str) -> Expander<'a> {
        Expander {
            st,
            project_id,
            visible: None,
        }
    }

    /// Only follow references to folders `visible` allows.
    pub fn with_filter(mut self, visible: Visible<'a>) -> Expander<'a> {
        self.visible = Some(visible);
        self
    }

    /// `raw`, a value of a secret in (`environment`, `path`), with its
    /// references expanded.
    pub fn expand(&self, environment: &str, path: &str, raw: &str) -> String {
        self.expand_at(environment, path, raw, 0)
    }

    fn expand_at(&self, environment: &str, path: &str, raw: &str, depth: usize) -> String {
        let mut out = String::with_capacity(raw.len());
        let mut rest = raw;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                return out;
            };
            out.push_str(&self.resolve(environment, path, after[..end].trim(), depth));
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out
    }

    fn resolve(&self, environment: &str, path: &str, reference: &str, depth: usize) -> String {
        if depth >= MAX_DEPTH {
            return format!("${{{reference}}}");
        }
        let parts: Vec<&str> = reference.split('.').collect();
        let (env, folder, key) = match parts.as_slice() {
            [key] => (environment, path.to_owned(), *key),
            [env, middle @ .., key] => (*env, normalize_path(&middle.join("/")), *key),
            [] => return String::new(),
        };
        if self.visible.is_some_and(|visible| !visible(env, &folder)) {
            return String::new();
        }
        match self.st.find_secret(self.project_id, env, &folder, key) {
            Some(secret) => self.expand_at(env, &folder, &secret.value, depth + 1),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Secret;

    fn secret(env: &str, path: &str, key: &str, value: &str) -> Secret {
        Secret {
            id: format!("{env}{path}{key}"),
            project_id: "p".into(),
            environment: env.into(),
            path: path.into(),
            key: key.into(),
            value: value.into(),
            comment: String::new(),
            version: 1,
            skip_multiline_encoding: false,
            reminder_note: None,
            reminder_repeat_days: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn local_and_cross_folder_references() {
        let mut st = State::default();
        for s in [
            secret("dev", "/", "API_KEY", "abc456"),
            secret("dev", "/backend", "BACKEND_TOKEN", "tok-1"),
            secret("prod", "/", "ROOT", "r"),
            secret("dev", "/", "CHAIN", "<${API_KEY}>"),
            secret("dev", "/", "LOOP", "${LOOP}"),
        ] {
            st.secrets.insert(s.id.clone(), s);
        }
        let x = Expander::new(&st, "p");
        assert_eq!(
            x.expand(
                "dev",
                "/",
                "key=${API_KEY};tok=${dev.backend.BACKEND_TOKEN}"
            ),
            "key=abc456;tok=tok-1"
        );
        assert_eq!(
            x.expand("dev", "/", "${prod.ROOT}-${ CHAIN }"),
            "r-<abc456>"
        );
        assert_eq!(x.expand("dev", "/", "${MISSING}x"), "x");
        assert_eq!(x.expand("dev", "/", "open ${API_KEY"), "open ${API_KEY");
        assert_eq!(x.expand("dev", "/", "${LOOP}"), "${LOOP}");
        assert_eq!(x.expand("dev", "/backend", "${BACKEND_TOKEN}"), "tok-1");
        let only_root = |_: &str, path: &str| path == "/";
        let x = Expander::new(&st, "p").with_filter(&only_root);
        assert_eq!(
            x.expand("dev", "/", "${API_KEY}|${dev.backend.BACKEND_TOKEN}"),
            "abc456|"
        );
    }
}
