//! The JSON the command line prints: every object carries `"schema"`, the
//! version of what the tool prints (bumped when a field is removed, renamed
//! or changes meaning; new fields do not bump it), first, before the
//! object's own fields in their order.

use anyhow::Result;

/// The version of the JSON the tool prints.
pub const SCHEMA: u32 = 1;

/// `v` as one line of JSON, with `"schema"` first when it is an object.
pub fn line(v: &impl serde::Serialize) -> Result<String> {
    let text = serde_json::to_string(v)?;
    Ok(with_schema(text))
}

/// `v` as indented JSON, with `"schema"` first when it is an object.
pub fn pretty(v: &impl serde::Serialize) -> Result<String> {
    let text = serde_json::to_string_pretty(v)?;
    Ok(match text.strip_prefix("{\n") {
        Some(rest) => format!("{{\n  \"schema\": {SCHEMA},\n{rest}"),
        None => text,
    })
}

fn with_schema(text: String) -> String {
    match text.strip_prefix('{') {
        Some("}") => format!("{{\"schema\":{SCHEMA}}}"),
        Some(rest) => format!("{{\"schema\":{SCHEMA},{rest}"),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_carry_the_schema_first_and_keep_their_fields() {
        let v = serde_json::json!({"b": 1, "a": [1, 2]});
        let l = line(&v).unwrap();
        assert!(l.starts_with(&format!("{{\"schema\":{SCHEMA},")), "{l}");
        let back: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(back["schema"], SCHEMA);
        assert_eq!(back["a"], serde_json::json!([1, 2]));
        let p: serde_json::Value = serde_json::from_str(&pretty(&v).unwrap()).unwrap();
        assert_eq!(p["schema"], SCHEMA);
        assert_eq!(
            line(&serde_json::json!({})).unwrap(),
            format!("{{\"schema\":{SCHEMA}}}")
        );
        // Not an object: as it is.
        assert_eq!(line(&[1, 2]).unwrap(), "[1,2]");
    }
}
