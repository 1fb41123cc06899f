//! The one rule that decides a setting: its flag, else its environment variable, else its key in
//! `config.toml`, else its default (which the caller holds: see `Settings::default`).
//!
//! Every value that is given is checked, even one a higher layer overrides: a malformed variable
//! or key is an error naming it rather than a latent surprise for the day the flag is dropped.
//! The environment is a function so that tests never touch the process's own.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::bail;

use super::flags::humantime_duration;

/// Parses the value of the environment variable `name`; its error names the variable and the
/// value, since that is what the user has to find and fix.
pub(super) type Parse<T> = fn(name: &str, value: &str) -> anyhow::Result<T>;

/// The layers below the command line. The file's values come typed (serde checked them when the
/// file was read), so only the environment needs parsing here.
pub(super) struct Layers<E> {
    env: E,
}

impl<E: Fn(&str) -> Option<String>> Layers<E> {
    pub(super) fn new(env: E) -> Self {
        Self { env }
    }

    /// A setting from the first layer that gives it: `flag`, then the variable `var` (parsed by
    /// `parse`), then `file`; `None` when none does, and the caller's default applies.
    pub(super) fn pick<T>(
        &self,
        flag: Option<T>,
        var: &str,
        parse: Parse<T>,
        file: Option<T>,
    ) -> anyhow::Result<Option<T>> {
        let env = self.var(var).map(|v| parse(var, &v)).transpose()?;
        Ok(flag.or(env).or(file))
    }

    /// A variable's value. A blank one counts as unset, so `FORKD_X= forkd serve` clears it.
    pub(super) fn var(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.trim().is_empty())
    }
}

/// Anything with `FromStr`, surrounding blanks ignored.
pub(super) fn from_str<T: FromStr>(name: &str, value: &str) -> anyhow::Result<T>
where
    T::Err: fmt::Display,
{
    value
        .trim()
        .parse()
        .map_err(|e| anyhow::anyhow!("{name}={value:?}: {e}"))
}

/// A boolean in the spellings people put in environments (`1`, `yes`, `on`, `true`, ...).
pub(super) fn boolean(name: &str, value: &str) -> anyhow::Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!("{name}={value:?} is not a boolean: use true or false"),
    }
}

/// One of a clap value enum's names, case-insensitively, as its flag takes it.
pub(super) fn value_enum<T: clap::ValueEnum>(name: &str, value: &str) -> anyhow::Result<T> {
    T::from_str(value.trim(), true).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_owned()))
            .collect();
        anyhow::anyhow!("{name}={value:?}: expected one of {}", names.join(", "))
    })
}

/// A duration such as `10s` or `1m 30s`.
pub(super) fn duration(name: &str, value: &str) -> anyhow::Result<std::time::Duration> {
    humantime_duration(value).map_err(|e| anyhow::anyhow!("{name}={value:?}: {e}"))
}

/// A lease (see [`super::flags::lease_duration`]).
pub(super) fn lease(name: &str, value: &str) -> anyhow::Result<std::time::Duration> {
    super::flags::lease_duration(value).map_err(|e| anyhow::anyhow!("{name}={value:?}: {e}"))
}

/// A `min_free_disk` (see [`forkd_engine::MinFreeDisk::parse`]).
pub(super) fn min_free_disk(name: &str, value: &str) -> anyhow::Result<forkd_engine::MinFreeDisk> {
    forkd_engine::MinFreeDisk::parse(value).map_err(|e| anyhow::anyhow!("{name}: {e}"))
}

/// Text taken as it is (a log filter, an API key).
pub(super) fn text(_: &str, value: &str) -> anyhow::Result<String> {
    Ok(value.to_owned())
}

/// A path taken as it is: relative to the working directory, as on the command line.
pub(super) fn path(_: &str, value: &str) -> anyhow::Result<PathBuf> {
    Ok(PathBuf::from(value))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn layers(var: Option<&'static str>) -> Layers<impl Fn(&str) -> Option<String>> {
        Layers::new(move |name: &str| (name == "V").then_some(var?.to_owned()))
    }

    #[test]
    fn the_first_layer_that_gives_a_value_wins() {
        let pick = |l: &Layers<_>, flag, file| l.pick(flag, "V", from_str::<u32>, file).unwrap();
        assert_eq!(pick(&layers(Some("2")), Some(1), Some(3)), Some(1));
        assert_eq!(pick(&layers(Some("2")), None, Some(3)), Some(2));
        assert_eq!(
            pick(&layers(Some(" ")), None, Some(3)),
            Some(3),
            "blank is unset"
        );
        assert_eq!(pick(&layers(None), None, None), None);
    }

    #[test]
    fn a_bad_variable_is_an_error_even_under_a_flag() {
        let err = layers(Some("x"))
            .pick(Some(1), "V", from_str::<u32>, None)
            .unwrap_err();
        assert!(err.to_string().starts_with("V=\"x\": "), "{err}");
    }
}
