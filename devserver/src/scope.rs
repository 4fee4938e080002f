//! Folder-path globs, as the real server's permission conditions and event
//! subscriptions write them: `/backend/**` is `/backend` and everything
//! below it, `*` matches within one path segment, `?` one character, and a
//! path without wildcards only itself.

/// Whether `pattern` (a glob over folder paths) matches `path`. Both are
/// compared segment by segment; leading, trailing and doubled `/` do not
/// matter.
pub(crate) fn glob_matches(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = segments(pattern);
    let path: Vec<&str> = segments(path);
    match_segments(&pattern, &path)
}

/// Whether the text has glob wildcards.
pub(crate) fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?'])
}

fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

fn match_segments(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| match_segments(rest, &path[skip..])),
        Some((first, rest)) => match path.split_first() {
            Some((seg, path_rest)) => {
                match_segment(first.as_bytes(), seg.as_bytes()) && match_segments(rest, path_rest)
            }
            None => false,
        },
    }
}

/// `*` and `?` within one segment (iterative, with backtracking to the last
/// `*`).
fn match_segment(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_matches("/backend/**", "/backend"));
        assert!(glob_matches("/backend/**", "/backend/db"));
        assert!(glob_matches("/backend/**", "/backend/db/x"));
        assert!(!glob_matches("/backend/**", "/backends"));
        assert!(!glob_matches("/backend/**", "/"));
        assert!(glob_matches("/**", "/"));
        assert!(glob_matches("/**", "/a/b"));
        assert!(glob_matches("/", "/"));
        assert!(!glob_matches("/", "/a"));
        assert!(glob_matches("/backend", "/backend/"));
        assert!(!glob_matches("/backend", "/backend/db"));
        assert!(glob_matches("/app-*/conf", "/app-1/conf"));
        assert!(!glob_matches("/app-*/conf", "/app-1/x/conf"));
        assert!(glob_matches("/a/**/z", "/a/z"));
        assert!(glob_matches("/a/**/z", "/a/b/c/z"));
        assert!(glob_matches("/v?", "/v1"));
        assert!(!glob_matches("/v?", "/v12"));
        // A registration's own text is matched literally where it has no
        // wildcards of the pattern's.
        assert!(glob_matches("/backend/**", "/backend/**"));
        assert!(!glob_matches("/backend/**", "/**"));
    }

    #[test]
    fn segments_with_stars() {
        assert!(match_segment(b"a*c", b"abbbc"));
        assert!(match_segment(b"*", b""));
        assert!(match_segment(b"*x*", b"axb"));
        assert!(!match_segment(b"a*c", b"abd"));
        assert!(match_segment(b"a**", b"a"));
    }

    #[test]
    fn wildcards() {
        assert!(is_glob("/a/**"));
        assert!(is_glob("/v?"));
        assert!(!is_glob("/a/b"));
    }
}
