//! The library's enums as flag values. Their names and help come from the types' own JSON
//! Schema (serde's names, the variants' doc comments), so clap stays in the binary and a flag
//! takes exactly the names a campaign file does.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use serde::de::DeserializeOwned;

/// (name, help) of every value of `T`, in declaration order.
fn values<T: schemars::JsonSchema>() -> Vec<(String, Option<String>)> {
    let schema = serde_json::to_value(schemars::schema_for!(T)).expect("a schema serializes");
    let names = |v: &serde_json::Value| -> Vec<String> {
        let listed = v.get("enum").and_then(|e| e.as_array()).into_iter().flatten();
        v.get("const").into_iter().chain(listed).filter_map(|n| n.as_str().map(str::to_string)).collect()
    };
    let mut out: Vec<(String, Option<String>)> = names(&schema).into_iter().map(|n| (n, None)).collect();
    for alt in schema.get("oneOf").and_then(|o| o.as_array()).into_iter().flatten() {
        let help = alt.get("description").and_then(|d| d.as_str()).map(|d| d.replace('\n', " ").trim_end_matches('.').to_string());
        out.extend(names(alt).into_iter().map(|n| (n, help.clone())));
    }
    out
}

/// A parser of `T` from the names its schema lists, each with its help.
pub fn parser<T>() -> impl TypedValueParser<Value = T>
where
    T: schemars::JsonSchema + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let possible = values::<T>().into_iter().map(|(name, help)| {
        // Built once per flag for the life of the process.
        let name: &'static str = Box::leak(name.into_boxed_str());
        let v = PossibleValue::new(name);
        match help {
            Some(h) => v.help(Box::leak(h.into_boxed_str()) as &'static str),
            None => v,
        }
    });
    PossibleValuesParser::new(possible)
        .map(|s: String| serde_json::from_value::<T>(serde_json::Value::String(s)).expect("a name the type's schema lists"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_is_offered_under_its_serde_name() {
        let names = |v: Vec<(String, Option<String>)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        assert_eq!(names(values::<sovereign::plan::SourceKind>()), ["p", "d", "f"]);
        assert_eq!(names(values::<sovereign::engine::QuantType>()), ["f16", "q8_0", "q4_0", "q4_k_m"]);
        let arch = names(values::<sovereign::forge::Arch>());
        assert!(arch.len() == 50 && arch[0] == "qwen3moe" && arch.contains(&"gpt-oss".to_string()), "{arch:?}");
        let cells = names(values::<sovereign::source::fault::FaultCell>());
        assert!(cells.len() == 11 && cells.contains(&"corrupt_byte".to_string()), "{cells:?}");
        let help = values::<sovereign::cell::ExpertsMode>();
        assert_eq!(help[0], ("resident".to_string(), Some("Stock llama.cpp: every expert resident".to_string())));
    }
}
