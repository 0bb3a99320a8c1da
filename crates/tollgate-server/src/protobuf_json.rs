//! `google.protobuf.Struct` and JSON, both ways: dynamic metadata in
//! Envoy's answers, and descriptor metadata in `RateLimitConfig` resources.

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

/// A JSON object as `google.protobuf.Struct`.
pub(crate) fn to_struct(fields: serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: fields.into_iter().map(|(key, value)| (key, to_value(value))).collect(),
    }
}

fn to_value(value: serde_json::Value) -> Value {
    use serde_json::Value as Json;
    let kind = match value {
        Json::Null => Kind::NullValue(0),
        Json::Bool(flag) => Kind::BoolValue(flag),
        Json::Number(number) => Kind::NumberValue(number.as_f64().unwrap_or_default()),
        Json::String(text) => Kind::StringValue(text),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.into_iter().map(to_value).collect(),
        }),
        Json::Object(fields) => Kind::StructValue(to_struct(fields)),
    };
    Value { kind: Some(kind) }
}

/// A `google.protobuf.Struct` as a JSON object (a number that JSON cannot
/// hold, NaN or infinite, is null).
pub(crate) fn from_struct(fields: &Struct) -> serde_json::Map<String, serde_json::Value> {
    fields
        .fields
        .iter()
        .map(|(name, value)| (name.clone(), from_value(value)))
        .collect()
}

fn from_value(value: &Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(flag)) => serde_json::Value::Bool(*flag),
        Some(Kind::NumberValue(number)) => {
            serde_json::Number::from_f64(*number).map_or(serde_json::Value::Null, serde_json::Value::Number)
        }
        Some(Kind::StringValue(text)) => serde_json::Value::String(text.clone()),
        Some(Kind::ListValue(list)) => serde_json::Value::Array(list.values.iter().map(from_value).collect()),
        Some(Kind::StructValue(fields)) => serde_json::Value::Object(from_struct(fields)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_goes_through_a_struct_and_back() {
        let json = serde_json::json!({"a": 1.5, "b": [true, null, "x"], "c": {"d": "e"}});
        let serde_json::Value::Object(fields) = json.clone() else {
            unreachable!()
        };
        assert_eq!(
            serde_json::Value::Object(super::from_struct(&super::to_struct(fields))),
            json
        );
    }
}
