use super::labels::sanitize;
use super::*;

#[test]
fn stat_names_are_sanitized_as_envoyproxy_ratelimit_does() {
    assert_eq!(sanitize("d.remote_address_50.0.0.5"), "d.remote_address_50_0_0_5");
    assert_eq!(sanitize("d.a:b|c"), "d.a_b_c");
    assert_eq!(sanitize("d.v1.2.3"), "d.v1.2.3");
    assert_eq!(
        upstream_labels("d", "key1_value1.subkey1.deeper"),
        KeyLabels {
            domain: "d".to_owned(),
            key1: "key1_value1".to_owned(),
            key2: Some("subkey1".to_owned()),
        }
    );
    assert_eq!(upstream_labels("d", "k").key2, None);
}
