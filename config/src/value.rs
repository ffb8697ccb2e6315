//! Typed setting values read from text once, the same way from a file, an
//! environment variable and a flag: a name out of a fixed list ([`Named`],
//! with [`by_name`] for serde and [`named_parser`] for clap) and a listen
//! address ([`parse_listen`], with [`listen`] for serde).
//!
//! The types themselves live with their owners (a scheduling policy in the
//! scheduler's core): this module only says how a setting spells them.

use std::fmt;
use std::net::SocketAddr;

/// A value written as one of a fixed list of names, exactly (a policy).
///
/// Settings take only these names: other spellings a type may read
/// elsewhere (annotations, say) are refused, so a file means one thing.
pub trait Named: Copy + Send + Sync + 'static {
    /// What a value is, for messages: `policy`.
    const WHAT: &'static str;
    /// Every value, in the order messages and `--help` list them.
    const ALL: &'static [Self];

    /// The value's name.
    fn name(self) -> &'static str;

    /// The value named exactly `name`.
    ///
    /// # Errors
    /// [`UnknownName`] listing every name.
    fn from_name(name: &str) -> Result<Self, UnknownName> {
        Self::ALL
            .iter()
            .copied()
            .find(|v| v.name() == name)
            .ok_or_else(|| UnknownName {
                what: Self::WHAT,
                value: name.to_owned(),
                choices: Self::ALL.iter().map(|v| v.name()).collect(),
            })
    }
}

/// A name that is not one of a [`Named`] type's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}` (one of: {choices})", choices = choices.join(", "))]
pub struct UnknownName {
    /// What was named (`policy`).
    pub what: &'static str,
    /// The name given.
    pub value: String,
    /// Every accepted name.
    pub choices: Vec<&'static str>,
}

/// A clap value parser for a [`Named`] type: `--help` lists the names, and a
/// wrong one is refused with them.
#[must_use]
pub fn named_parser<T: Named>() -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(T::ALL.iter().map(|v| v.name()))
        .try_map(|name: String| T::from_name(&name))
}

/// Serde for a [`Named`] field: `#[serde(with = "gpuslice_config::by_name")]`;
/// [`by_name::option`] for an `Option`.
pub mod by_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::value::Named;

    /// Writes the value's name.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<T: Named, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(value.name())
    }

    /// Reads a name; anything else is an error listing the names.
    ///
    /// # Errors
    /// Not a string, or not one of the names.
    pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        let name = String::deserialize(d)?;
        T::from_name(&name).map_err(serde::de::Error::custom)
    }

    /// The same for an `Option` (a flag that may be absent).
    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};

        use crate::value::Named;

        /// Writes the name, or nothing.
        ///
        /// # Errors
        /// The serializer's.
        pub fn serialize<T: Named, S: Serializer>(
            value: &Option<T>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match value {
                Some(v) => s.serialize_some(v.name()),
                None => s.serialize_none(),
            }
        }

        /// Reads a name or nothing.
        ///
        /// # Errors
        /// Not one of the names.
        pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<T>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|name| T::from_name(&name).map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}

/// An address that is neither `host:port` nor `:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct BadAddress(pub String);

impl fmt::Display for BadAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is not an address like 0.0.0.0:443 or :443", self.0)
    }
}

/// Parses a listen address: `host:port`, or `:port` for all interfaces.
///
/// # Errors
/// [`BadAddress`] for anything else.
pub fn parse_listen(value: &str) -> Result<SocketAddr, BadAddress> {
    let full = if value.starts_with(':') {
        format!("0.0.0.0{value}")
    } else {
        value.to_owned()
    };
    full.parse().map_err(|_| BadAddress(value.to_owned()))
}

/// Serde for a listen address field read with [`parse_listen`]:
/// `#[serde(with = "gpuslice_config::listen")]`; [`listen::option`] for an
/// `Option`.
pub mod listen {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes `host:port`.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: Serializer>(addr: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
        addr.serialize(s)
    }

    /// Reads `host:port` or `:port`.
    ///
    /// # Errors
    /// Not a string, or not an address.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        let text = String::deserialize(d)?;
        crate::value::parse_listen(&text).map_err(serde::de::Error::custom)
    }

    /// The same for an `Option` (unset: nothing listens).
    pub mod option {
        use std::net::SocketAddr;

        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        /// Writes `host:port`, or nothing.
        ///
        /// # Errors
        /// The serializer's.
        pub fn serialize<S: Serializer>(
            addr: &Option<SocketAddr>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            addr.serialize(s)
        }

        /// Reads `host:port`, `:port`, or nothing.
        ///
        /// # Errors
        /// Not an address.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<SocketAddr>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|text| crate::value::parse_listen(&text).map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Colour {
        Red,
        Blue,
    }

    impl Named for Colour {
        const WHAT: &'static str = "colour";
        const ALL: &'static [Self] = &[Self::Red, Self::Blue];
        fn name(self) -> &'static str {
            match self {
                Self::Red => "red",
                Self::Blue => "blue",
            }
        }
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        #[serde(with = "by_name")]
        colour: Colour,
        #[serde(with = "by_name::option")]
        other: Option<Colour>,
        #[serde(with = "listen")]
        listen: SocketAddr,
        #[serde(with = "listen::option")]
        metrics: Option<SocketAddr>,
    }

    #[test]
    fn names_read_back_exactly_and_a_wrong_one_lists_the_names() {
        for c in Colour::ALL {
            assert_eq!(Colour::from_name(c.name()), Ok(*c));
        }
        let err = Colour::from_name("Red").unwrap_err();
        assert_eq!(err.to_string(), "unknown colour `Red` (one of: red, blue)");
    }

    #[test]
    fn fields_round_trip_through_serde() {
        let s = Sample {
            colour: Colour::Blue,
            other: None,
            listen: "127.0.0.1:8443".parse().unwrap(),
            metrics: Some("0.0.0.0:9395".parse().unwrap()),
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"colour":"blue","other":null,"listen":"127.0.0.1:8443","metrics":"0.0.0.0:9395"}"#
        );
        assert_eq!(serde_json::from_str::<Sample>(&json).unwrap(), s);
        let short: Sample = serde_json::from_str(
            r#"{"colour":"red","other":"blue","listen":":443","metrics":":9395"}"#,
        )
        .unwrap();
        assert_eq!(short.listen, "0.0.0.0:443".parse().unwrap());
        assert_eq!(short.other, Some(Colour::Blue));
        let err = serde_json::from_str::<Sample>(
            r#"{"colour":"green","other":null,"listen":":1","metrics":null}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown colour `green`"), "{err}");
    }

    #[test]
    fn listen_takes_host_port_or_port_only() {
        assert_eq!(parse_listen(":9395"), Ok("0.0.0.0:9395".parse().unwrap()));
        assert_eq!(parse_listen("[::1]:443"), Ok("[::1]:443".parse().unwrap()));
        assert_eq!(
            parse_listen("nowhere").unwrap_err().to_string(),
            "`nowhere` is not an address like 0.0.0.0:443 or :443"
        );
    }

    #[test]
    fn the_clap_parser_lists_the_names() {
        let cmd = clap::Command::new("t").arg(
            clap::Arg::new("colour")
                .long("colour")
                .value_parser(named_parser::<Colour>()),
        );
        let m = cmd
            .clone()
            .try_get_matches_from(["t", "--colour", "blue"])
            .unwrap();
        assert_eq!(m.get_one::<Colour>("colour"), Some(&Colour::Blue));
        let err = cmd
            .try_get_matches_from(["t", "--colour", "green"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("possible values: red, blue"), "{err}");
    }
}
