//! The JSON the command line prints: every object carries `"schema"`, the
//! version of what the tool prints (bumped when a field is removed, renamed
//! or changes meaning; new fields do not bump it), first, before the
//! object's own fields in their order.

use anyhow::Result;

/// The version of the JSON the tool prints.
pub const SCHEMA: u32 = 1;

/// What the tool may print as JSON: a type of its own with a JSON Schema,
/// from which the book's schemas are derived (`pagewise schema`). Only the
/// types of [`crate::schemas`] are printed, so no output goes without one.
pub trait Printed: serde::Serialize + schemars::JsonSchema {}

/// Each command's `--json` output and its JSON Schema, named as the book's
/// schema files are (`docs/book/src/schemas/NAME.json`).
pub fn schemas() -> Vec<(&'static str, serde_json::Value)> {
    use crate::*;
    use schemars::schema_for;
    let mut all = vec![
        ("probe", schema_for!(cmd_probe::Output<'static>)),
        ("demo", schema_for!(cmd_demo::Line)),
        ("track", schema_for!(cmd_track::Line)),
        ("snapshot", schema_for!(cmd_snapshot::Line<'static>)),
        (
            "snapshot-inspect",
            schema_for!(cmd_snapshot::InspectOutput<'static>),
        ),
        ("snapshot-diff", schema_for!(cmd_snapshot::DiffOutput)),
        ("snapshot-afl", schema_for!(cmd_afl::StatsOutput)),
        (
            "snapshot-restore",
            schema_for!(cmd_rollback::RestoreOutput<'static>),
        ),
        ("snapshot-extract", schema_for!(cmd_rollback::ExtractOutput)),
        ("snapshot-serve", schema_for!(cmd_rollback::ServeLine)),
        ("receive", schema_for!(cmd_receive::Line<'static>)),
        ("page-server", schema_for!(cmd_page_server::Line<'static>)),
        ("criu-export", schema_for!(cmd_criu::ExportOutput)),
        ("inspect", schema_for!(cmd_inspect::Output<'static>)),
        ("farmem-run", schema_for!(cmd_farmem::RunOutput<'static>)),
        ("farmem-ls", schema_for!(cmd_farmem::Instances)),
        (
            "farmem-serve",
            schema_for!(cmd_farmem_serve::ServeLine<'static>),
        ),
        ("thp-run", schema_for!(cmd_thp::RunLine<'static>)),
        ("thp-prezero", schema_for!(cmd_thp::PrezeroOutput<'static>)),
        ("dedup-run", schema_for!(cmd_dedup::Line<'static>)),
        ("agent", schema_for!(pagewise::agent::node::Step)),
    ];
    // Every object the tool prints carries the version of what it prints.
    all.drain(..)
        .map(|(name, s)| {
            let mut v = s.to_value();
            add_schema_field(&mut v);
            (name, v)
        })
        .collect()
}

/// Adds the `"schema"` field (see [`SCHEMA`]) to every object a schema
/// allows at its top (each branch of an untagged or tagged enum).
fn add_schema_field(s: &mut serde_json::Value) {
    fn add(v: &mut serde_json::Value) {
        for of in ["anyOf", "oneOf"] {
            if let Some(branches) = v.get_mut(of).and_then(|b| b.as_array_mut()) {
                branches.iter_mut().for_each(add);
                return;
            }
        }
        let object = v.get("type").and_then(|t| t.as_str()) == Some("object");
        // An object of a type defined apart (`$ref`) gets the field beside
        // the reference, as JSON Schema 2020-12 allows.
        let Some(o) = v
            .as_object_mut()
            .filter(|o| object || o.contains_key("$ref"))
        else {
            return;
        };
        let field = serde_json::json!({
            "description": "The version of what the tool prints (bumped when a field is removed, renamed or changes meaning).",
            "type": "integer",
            "const": SCHEMA,
        });
        if let Some(p) = o
            .entry("properties")
            .or_insert_with(|| serde_json::json!({}))
            .as_object_mut()
        {
            p.insert("schema".into(), field);
        }
        if let Some(r) = o
            .entry("required")
            .or_insert_with(|| serde_json::json!([]))
            .as_array_mut()
        {
            r.insert(0, "schema".into());
        }
    }
    add(s);
}

/// A value, or why it is not available on this machine.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "{T}OrUnavailable")]
pub enum OrUnavailable<T> {
    /// The value.
    Value(T),
    /// Why there is none.
    Unavailable {
        /// Why, as a sentence.
        unavailable: String,
    },
}

impl<T> From<std::result::Result<T, String>> for OrUnavailable<T> {
    fn from(r: std::result::Result<T, String>) -> Self {
        match r {
            Ok(v) => OrUnavailable::Value(v),
            Err(unavailable) => OrUnavailable::Unavailable { unavailable },
        }
    }
}

/// `v` as one line of JSON, with `"schema"` first when it is an object.
pub fn line(v: &impl Printed) -> Result<String> {
    let text = serde_json::to_string(v)?;
    Ok(with_schema(text))
}

/// `v` as indented JSON, with `"schema"` first when it is an object.
pub fn pretty(v: &impl Printed) -> Result<String> {
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

    #[derive(serde::Serialize, schemars::JsonSchema)]
    struct Two {
        b: u32,
        a: [u32; 2],
    }
    impl Printed for Two {}

    #[derive(serde::Serialize, schemars::JsonSchema)]
    struct Empty {}
    impl Printed for Empty {}

    impl Printed for [u32; 2] {}

    #[test]
    fn objects_carry_the_schema_first_and_keep_their_fields() {
        let v = Two { b: 1, a: [1, 2] };
        let l = line(&v).unwrap();
        assert!(l.starts_with(&format!("{{\"schema\":{SCHEMA},")), "{l}");
        let back: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(back["schema"], SCHEMA);
        assert_eq!(back["a"], serde_json::json!([1, 2]));
        let p: serde_json::Value = serde_json::from_str(&pretty(&v).unwrap()).unwrap();
        assert_eq!(p["schema"], SCHEMA);
        assert_eq!(line(&Empty {}).unwrap(), format!("{{\"schema\":{SCHEMA}}}"));
        // Not an object: as it is.
        assert_eq!(line(&[1u32, 2]).unwrap(), "[1,2]");
    }

    #[test]
    fn every_schema_requires_the_schema_field_of_every_object_it_allows() {
        let all = schemas();
        assert_eq!(
            all.len(),
            21,
            "one schema a command with --json or a JSON file"
        );
        for (name, s) in &all {
            let tops: Vec<&serde_json::Value> = match s.get("anyOf").or(s.get("oneOf")) {
                Some(b) => b.as_array().unwrap().iter().collect(),
                None => vec![s],
            };
            for t in tops {
                assert_eq!(t["properties"]["schema"]["const"], SCHEMA, "{name}: {t}");
                assert_eq!(t["required"][0], "schema", "{name}: {t}");
            }
        }
    }
}
