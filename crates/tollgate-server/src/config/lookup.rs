//! Matching a request's descriptor to a rule, as envoyproxy/ratelimit does
//! (see the module docs of `config`).

use super::{Domain, Found, Level, Node, Rule};

impl Level {
    /// The node for an entry whose `key_value` is `composite`, as
    /// envoyproxy/ratelimit finds it: exact, then the first matching
    /// wildcard, then the key alone. Also says whether a wildcard matched.
    fn find(&self, composite: &str, key: &str) -> Option<(&Node, bool)> {
        if let Some(&index) = self.by_composite.get(composite) {
            return Some((&self.nodes[index], false));
        }
        for (index, parts) in &self.wildcards {
            if wildcard_match(parts, composite) {
                return Some((&self.nodes[*index], true));
            }
        }
        self.by_composite.get(key).map(|&index| (&self.nodes[index], false))
    }
}

/// Whether `text` matches a pattern split on its `*`s: each `*` stands for
/// any run of characters, including none.
pub fn wildcard_match(parts: &[String], text: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|only| only == text);
    };
    if text.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let Some(rest) = text.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some(mut rest) = rest.strip_suffix(last.as_str()) else {
        return false;
    };
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// envoyproxy/ratelimit's stat key of a rule at exactly these entries (no
/// domain): `key_value.key2_value2`, `key` alone for an empty value. That
/// of a limit Envoy sends, and of an override.
pub fn exact_stat_key<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut key = String::new();
    for (name, value) in entries {
        if !key.is_empty() {
            key.push('.');
        }
        key.push_str(name);
        if !value.is_empty() {
            key.push('_');
            key.push_str(value);
        }
    }
    key
}

impl Domain {
    /// The rule for a request descriptor's entries, matched as
    /// envoyproxy/ratelimit does (see the module docs).
    pub fn lookup<'a>(&'a self, entries: &[(String, String)]) -> Option<Found<'a>> {
        let mut level = &self.descriptors;
        let mut found = None;
        let mut shared = Vec::new();
        let mut composite = String::new();
        // envoyproxy/ratelimit's value_to_metric stat key, built on the way.
        let mut valued = self.value_to_metric.then(String::new);
        for (depth, (key, value)) in entries.iter().enumerate() {
            composite.clear();
            composite.push_str(key);
            composite.push('_');
            composite.push_str(value);
            let Some((node, wildcard)) = level.find(&composite, key) else {
                break;
            };
            let pattern = |node: &'a Node| {
                let prefix_len = key.len() + 1;
                if node.composite.starts_with(key.as_str()) && node.composite.as_bytes().get(key.len()) == Some(&b'_') {
                    &node.composite[prefix_len..]
                } else {
                    node.composite.as_str()
                }
            };
            if wildcard && node.share_threshold {
                shared.push((depth, pattern(node)));
            }
            if let Some(valued) = valued.as_mut() {
                let shown = if wildcard {
                    if node.share_threshold {
                        pattern(node)
                    } else if node.value_to_metric {
                        value.as_str()
                    } else {
                        pattern(node)
                    }
                } else if node.value.is_some() || node.value_to_metric {
                    value.as_str()
                } else {
                    ""
                };
                if depth > 0 {
                    valued.push('.');
                }
                valued.push_str(key);
                if !shown.is_empty() {
                    valued.push('_');
                    valued.push_str(shown);
                }
            }
            if depth == entries.len() - 1 {
                found = node.rule.as_ref().map(|rule| (rule, node.metadata.as_ref()));
            }
            if node.descriptors.is_empty() {
                break;
            }
            level = &node.descriptors;
        }
        let (rule, metadata) = found?;
        let stat_key = if rule.detailed_metric {
            let mut detailed = String::new();
            for (depth, (key, value)) in entries.iter().enumerate() {
                if depth > 0 {
                    detailed.push('.');
                }
                detailed.push_str(key);
                match shared.iter().find(|(at, _)| *at == depth) {
                    Some((_, pattern)) => {
                        detailed.push('_');
                        detailed.push_str(pattern);
                    }
                    // Without share_threshold, envoyproxy/ratelimit writes
                    // `key_` for an empty value; with it, `key`.
                    None if !value.is_empty() || shared.is_empty() => {
                        detailed.push('_');
                        detailed.push_str(value);
                    }
                    None => {}
                }
            }
            Some(detailed)
        } else {
            valued.filter(|valued| *valued != rule.path)
        };
        Some(Found {
            rule,
            shared,
            stat_key,
            metadata,
        })
    }
}

/// Entries leading to a rule: each key, with its value where it is fixed.
pub type RulePath = Vec<(String, Option<String>)>;

/// The descriptors below a prefix that a rule applies to
/// ([`Domain::below`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Below {
    /// Descriptors the configuration names whole: the prefix, and the
    /// prefix followed by entries of fixed values.
    pub exact: Vec<Vec<(String, String)>>,
    /// Rules deeper down whose descriptors vary (a key of any value, or a
    /// wildcard): their path, and the prefix's entries followed by the keys
    /// (with the value where it is fixed) that lead to them.
    pub varying: Vec<(String, RulePath)>,
}

impl Domain {
    /// Every rule that applies below `prefix` (entries, outermost first):
    /// the prefix's own (as [`Domain::lookup`] matches it), then each rule
    /// deeper in the tree under the node the prefix reaches, depth first
    /// in file order. An empty prefix is the whole domain.
    pub fn below(&self, prefix: &[(String, String)]) -> Below {
        let mut below = Below::default();
        let mut level = &self.descriptors;
        let mut composite = String::new();
        for (depth, (key, value)) in prefix.iter().enumerate() {
            composite.clear();
            composite.push_str(key);
            composite.push('_');
            composite.push_str(value);
            let Some((node, _)) = level.find(&composite, key) else {
                return below;
            };
            if depth == prefix.len() - 1 && node.rule.is_some() {
                below.exact.push(prefix.to_vec());
            }
            level = &node.descriptors;
        }
        let mut path: RulePath = prefix
            .iter()
            .map(|(key, value)| (key.clone(), Some(value.clone())))
            .collect();
        walk_below(level, &mut path, &mut below);
        below
    }
}

fn walk_below(level: &Level, path: &mut RulePath, below: &mut Below) {
    for node in &level.nodes {
        let fixed = node.value.as_ref().filter(|value| !value.contains('*'));
        path.push((node.key.clone(), fixed.cloned()));
        if let Some(rule) = &node.rule {
            if path.iter().all(|(_, value)| value.is_some()) {
                below.exact.push(
                    path.iter()
                        .map(|(key, value)| (key.clone(), value.clone().unwrap_or_default()))
                        .collect(),
                );
            } else {
                below.varying.push((rule.path.clone(), path.clone()));
            }
        }
        walk_below(&node.descriptors, path, below);
        path.pop();
    }
}

impl Domain {
    /// The depth of the deepest rule: how many entries a descriptor with a
    /// rule of its own can have.
    pub fn deepest_rule(&self) -> usize {
        fn depth(level: &Level) -> usize {
            level
                .nodes
                .iter()
                .map(|node| {
                    let below = depth(&node.descriptors);
                    if below > 0 {
                        below + 1
                    } else {
                        usize::from(node.rule.is_some())
                    }
                })
                .max()
                .unwrap_or(0)
        }
        depth(&self.descriptors)
    }

    /// The first rule (in file order, depth first) with this `name`.
    pub fn named_rule(&self, name: &str) -> Option<&Rule> {
        fn search<'a>(level: &'a Level, name: &str) -> Option<&'a Rule> {
            level.nodes.iter().find_map(|node| {
                node.rule
                    .as_ref()
                    .filter(|rule| rule.name.as_deref() == Some(name))
                    .or_else(|| search(&node.descriptors, name))
            })
        }
        search(&self.descriptors, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(pattern: &str) -> Vec<String> {
        pattern.split('*').map(str::to_owned).collect()
    }

    #[test]
    fn wildcards_match_any_run_anywhere() {
        for (pattern, text, expected) in [
            ("ab*", "ab", true),
            ("ab*", "abc", true),
            ("ab*", "a", false),
            ("ab*yz", "abyz", true),
            ("ab*yz", "ab-yz", true),
            ("ab*yz", "abyyz", true),
            ("ab*yz", "abyzz", false),
            ("ab*yz", "aby", false),
            ("ab*yz", "abz", false),
            ("*", "", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-c", true),
            ("a*b*c", "acb", false),
            ("a*b*c", "ac", false),
            ("*b", "b", true),
            ("a**b", "ab", true),
            ("aa*aa", "aaa", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(wildcard_match(&parts(pattern), text), expected, "{pattern} ~ {text}");
        }
    }
}
