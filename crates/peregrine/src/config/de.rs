//! A deserializer wrapper that interpolates `${VAR}` in string values *while* serde_norway
//! deserializes the file, tracks the dotted key of every value, and records the keys the typed
//! model skips (reported as ignored) and the values that are secrets.
//!
//! Why interpolate here rather than on the text or on a parsed `Value`:
//! - the text is never rewritten, so every error keeps serde_norway's exact line and column
//!   (a substituted value with a newline, `#` or `: ` cannot shift lines or change the structure);
//! - only values are interpolated, as upstream does on its parsed dict (comments and keys are
//!   not, so a `${VAR}` in a comment never warns);
//! - the type the model asks for is known: `max_tokens: ${MAX_TOKENS:-4096}` becomes a number,
//!   `api_key: ${KEY}` stays a string even when the key is all digits;
//! - sections Peregrine ignores are skipped unread, so their unset variables do not warn.
//!
//! Numbers and booleans are requested from serde_norway with `deserialize_any` so that a plain
//! scalar holding a reference reaches `visit_str`, where it is interpolated and then parsed. A
//! boolean field also takes YAML 1.1's words (`yes`/`no`/`on`/`off`), as PyYAML, hence upstream,
//! reads them.
//!
//! Secrets: a value is secret when its key is (`api_key`, `*_password`), when it holds a URL or
//! PostgreSQL password, or when a secret variable (`*_KEY`, `*_TOKEN`, a `*_URL` with a
//! password, …) was substituted into it; then the whole final value is recorded, and a warning
//! about an unset `$NAME` in it does not quote the name (in `sk-abc$def` the "name" is part of
//! the key). `${NAME}` is deliberate syntax and is named; a value that is nothing but `${…}`
//! references holds no secret of its own and is not recorded.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};

use super::interpolate::{TooDeep, interpolate, is_placeholder_key, is_secret_name, is_url_name, only_braced_references, url_passwords};

/// The environment variables a value may reference.
pub(crate) type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What one pass over the file found besides the typed model.
#[derive(Debug, Default)]
pub(crate) struct Walk {
    path: Vec<String>,
    pending_key: Option<String>,
    /// Values that must never be printed.
    pub secrets: Vec<String>,
    /// Unset variables, by key.
    pub warnings: Vec<String>,
    /// Dotted keys the model skipped.
    pub ignored: Vec<String>,
    /// Values that kept an unset reference, by dotted key (to explain an error about them).
    pub unresolved: BTreeMap<String, Unresolved>,
    /// Secret values by dotted key (to keep even a short one out of an error about it).
    pub secret_values: BTreeMap<String, String>,
    /// The keys written so far in each mapping, by the path of the mapping.
    keys_seen: BTreeMap<Vec<String>, BTreeSet<String>>,
    /// The dotted key written twice in one mapping, when that stopped the walk.
    pub duplicate: Option<String>,
}

/// A value that kept an unset reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unresolved {
    /// The references as written (`${NAME}`, `$NAME`).
    pub references: Vec<String>,
    /// The value after interpolation.
    pub text: String,
    /// Whether the value is a secret (then neither it nor a bare `$NAME` of it is quoted).
    pub secret: bool,
}

impl Walk {
    fn dotted(&self) -> String {
        let mut out = String::new();
        for segment in &self.path {
            if !out.is_empty() && !segment.starts_with('[') {
                out.push('.');
            }
            out.push_str(segment);
        }
        out
    }

    fn parent_key(&self) -> &str {
        self.path.iter().rev().filter(|segment| !segment.starts_with('[')).nth(1).map_or("", String::as_str)
    }

    fn last_key(&self) -> &str {
        self.path.iter().rev().find(|segment| !segment.starts_with('[')).map_or("", String::as_str)
    }

    /// Records `key` as written in the current mapping; a key written twice is refused (serde
    /// would keep either the last value or report the mapping's first line, not this one).
    fn key(&mut self, key: String) -> Result<(), String> {
        let seen = self.keys_seen.entry(self.path.clone()).or_default();
        if !seen.insert(key.clone()) {
            let mut dotted = self.dotted();
            if !dotted.is_empty() {
                dotted.push('.');
            }
            dotted.push_str(&key);
            self.duplicate = Some(dotted);
            return Err(format!(
                "`{key}` is written more than once in the same mapping; write each key once (merge the two entries into one)"
            ));
        }
        self.pending_key = Some(key);
        Ok(())
    }

    /// Interpolates one value at the current key, recording warnings and secrets.
    fn value(&mut self, raw: &str, env: EnvLookup<'_>) -> Result<Option<String>, TooDeep> {
        let result = interpolate(raw, env)?;
        let key = self.dotted();
        let provider = self.parent_key().to_owned();
        let secret_key = is_secret_name(self.last_key()) && !is_placeholder_key(&provider, &result.text);
        let mut secret = secret_key;
        for (name, value) in &result.substituted {
            if (secret_key || is_secret_name(name)) && !is_placeholder_key(&provider, value) {
                secret = true;
                self.secret(value);
            } else if is_url_name(name) {
                let passwords = url_passwords(value);
                if !passwords.is_empty() {
                    secret = true;
                    self.secret(value);
                    passwords.iter().for_each(|password| self.secret(password));
                }
            }
        }
        // A password that is still a `${…}` placeholder is not secret (the warning names it).
        for password in url_passwords(&result.text).into_iter().filter(|password| !password.contains("${")) {
            secret = true;
            self.secret(&password);
        }
        let placeholder = !result.unresolved.is_empty() && only_braced_references(raw);
        if secret && !placeholder {
            self.secret(&result.text);
            self.secret_values.insert(key.clone(), result.text.clone());
        }
        let secret = secret && !placeholder;
        for reference in &result.unresolved {
            let warning = if secret && !reference.starts_with("${") {
                format!(
                    "{key} contains a `$` reference to a variable that is not set; it is kept as written (write `$$` for a literal `$`, or set the variable in the environment or .env)"
                )
            } else {
                format!("{key} uses {reference}, which is not set; it is kept as written (set it in the environment or in .env)")
            };
            self.warn(warning);
        }
        if !result.unresolved.is_empty() {
            self.unresolved.insert(key.clone(), Unresolved { references: result.unresolved.clone(), text: result.text.clone(), secret });
        }
        if result.unterminated {
            self.warn(format!("{key} has an unterminated `${{` (no closing `}}`); it is kept as written (write `$$` for a literal `$`)"));
        }
        Ok(result.changed.then_some(result.text))
    }

    fn warn(&mut self, warning: String) {
        if !self.warnings.contains(&warning) {
            self.warnings.push(warning);
        }
    }

    fn secret(&mut self, value: &str) {
        if !value.is_empty() && !self.secrets.iter().any(|known| known == value) {
            self.secrets.push(value.to_owned());
        }
    }
}

/// The shared state of one deserialization.
#[derive(Clone, Copy)]
pub(crate) struct Scope<'c> {
    env: EnvLookup<'c>,
    walk: &'c RefCell<Walk>,
}

impl<'c> Scope<'c> {
    /// A scope over `walk` resolving variables with `env`.
    pub(crate) fn new(env: EnvLookup<'c>, walk: &'c RefCell<Walk>) -> Self {
        Self { env, walk }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Key,
    Value,
}

/// What the model asked for, so that an interpolated string can become that type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hint {
    Str,
    Int,
    Float,
    Bool,
    Any,
}

/// The wrapping deserializer.
pub(crate) struct Interpolating<'c, D> {
    inner: D,
    scope: Scope<'c>,
    role: Role,
}

impl<'c, D> Interpolating<'c, D> {
    /// Wraps the document's deserializer.
    pub(crate) fn new(inner: D, scope: Scope<'c>) -> Self {
        Self { inner, scope, role: Role::Value }
    }

    fn visit<V>(&self, visitor: V, hint: Hint) -> Visit<'c, V> {
        Visit { visitor, scope: self.scope, role: self.role, hint }
    }
}

macro_rules! as_scalar {
    ($($method:ident => $hint:expr),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                let visit = self.visit(visitor, $hint);
                if self.role == Role::Value { self.inner.deserialize_any(visit) } else { self.inner.$method(visit) }
            }
        )*
    };
}

macro_rules! forward {
    ($($method:ident => $hint:expr),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                let visit = self.visit(visitor, $hint);
                self.inner.$method(visit)
            }
        )*
    };
}

impl<'de, 'c, D: Deserializer<'de>> Deserializer<'de> for Interpolating<'c, D> {
    type Error = D::Error;

    as_scalar! {
        deserialize_bool => Hint::Bool,
        deserialize_i8 => Hint::Int, deserialize_i16 => Hint::Int, deserialize_i32 => Hint::Int, deserialize_i64 => Hint::Int,
        deserialize_i128 => Hint::Int,
        deserialize_u8 => Hint::Int, deserialize_u16 => Hint::Int, deserialize_u32 => Hint::Int, deserialize_u64 => Hint::Int,
        deserialize_u128 => Hint::Int,
        deserialize_f32 => Hint::Float, deserialize_f64 => Hint::Float,
    }

    forward! {
        deserialize_char => Hint::Str, deserialize_str => Hint::Str, deserialize_string => Hint::Str,
        deserialize_identifier => Hint::Str,
        deserialize_any => Hint::Any,
        deserialize_bytes => Hint::Any, deserialize_byte_buf => Hint::Any,
        deserialize_option => Hint::Any, deserialize_unit => Hint::Any,
        deserialize_seq => Hint::Any, deserialize_map => Hint::Any,
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        let visit = self.visit(visitor, Hint::Any);
        self.inner.deserialize_unit_struct(name, visit)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        let visit = self.visit(visitor, Hint::Any);
        self.inner.deserialize_newtype_struct(name, visit)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, D::Error> {
        let visit = self.visit(visitor, Hint::Any);
        self.inner.deserialize_tuple(len, visit)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(self, name: &'static str, len: usize, visitor: V) -> Result<V::Value, D::Error> {
        let visit = self.visit(visitor, Hint::Any);
        self.inner.deserialize_tuple_struct(name, len, visit)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visit = self.visit(visitor, Hint::Any);
        self.inner.deserialize_struct(name, fields, visit)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visit = self.visit(visitor, Hint::Any);
        self.inner.deserialize_enum(name, variants, visit)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        if self.role == Role::Value {
            let mut walk = self.scope.walk.borrow_mut();
            let key = walk.dotted();
            if !key.is_empty() {
                walk.ignored.push(key);
            }
        }
        self.inner.deserialize_ignored_any(visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// The wrapping visitor: interpolates strings (values) or records them (keys).
struct Visit<'c, V> {
    visitor: V,
    scope: Scope<'c>,
    role: Role,
    hint: Hint,
}

impl<'c, V> Visit<'c, V> {
    /// Records a key (an error for one written twice, raised here so that serde_norway gives it
    /// the position of the second one).
    fn key<E: de::Error>(&self, key: impl fmt::Display) -> Result<(), E> {
        if self.role == Role::Key {
            self.scope.walk.borrow_mut().key(key.to_string()).map_err(E::custom)?;
        }
        Ok(())
    }

    /// The value after interpolation, or `None` when nothing changed.
    fn interpolated<E: de::Error>(&self, raw: &str) -> Result<Option<String>, E> {
        match self.role {
            Role::Key => {
                self.key(raw)?;
                Ok(None)
            }
            Role::Value => self.scope.walk.borrow_mut().value(raw, self.scope.env).map_err(|too_deep| E::custom(too_deep)),
        }
    }

    /// A YAML 1.1 boolean word (`yes`, `off`) written where the model asks for a boolean.
    fn written_bool(&self, value: &str) -> Option<bool> {
        (self.role == Role::Value && self.hint == Hint::Bool).then(|| yaml_bool(value.trim())).flatten()
    }

    /// Hands an interpolated string on as the type the model asked for.
    fn typed<'de, E: de::Error>(self, text: String) -> Result<V::Value, E>
    where
        V: Visitor<'de>,
    {
        let trimmed = text.trim();
        match self.hint {
            Hint::Str => self.visitor.visit_string(text),
            Hint::Int => match (trimmed.parse::<u64>(), trimmed.parse::<i64>()) {
                (Ok(value), _) => self.visitor.visit_u64(value),
                (_, Ok(value)) => self.visitor.visit_i64(value),
                _ => self.visitor.visit_string(text),
            },
            Hint::Float => match trimmed.parse::<f64>() {
                Ok(value) => self.visitor.visit_f64(value),
                Err(_) => self.visitor.visit_string(text),
            },
            Hint::Bool => match yaml_bool(trimmed) {
                Some(value) => self.visitor.visit_bool(value),
                None => self.visitor.visit_string(text),
            },
            Hint::Any => {
                if let Some(value) = parse_bool(trimmed) {
                    self.visitor.visit_bool(value)
                } else if let Ok(value) = trimmed.parse::<u64>() {
                    self.visitor.visit_u64(value)
                } else if let Ok(value) = trimmed.parse::<i64>() {
                    self.visitor.visit_i64(value)
                } else if let Some(value) = trimmed.parse::<f64>().ok().filter(|_| trimmed.contains(['.', 'e', 'E'])) {
                    self.visitor.visit_f64(value)
                } else if matches!(trimmed, "~" | "null" | "Null" | "NULL") {
                    self.visitor.visit_unit()
                } else {
                    self.visitor.visit_string(text)
                }
            }
        }
    }
}

/// YAML 1.2's booleans (what serde_norway reads as a boolean).
fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// YAML 1.1's booleans, as PyYAML reads them, for fields that are booleans.
fn yaml_bool(text: &str) -> Option<bool> {
    parse_bool(text).or(match text {
        "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    })
}

macro_rules! pass_scalar {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(
            fn $method<E: de::Error>(self, value: $ty) -> Result<V::Value, E> {
                self.key::<E>(value)?;
                self.visitor.$method(value)
            }
        )*
    };
}

impl<'de, 'c, V: Visitor<'de>> Visitor<'de> for Visit<'c, V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(formatter)
    }

    pass_scalar! {
        visit_bool(bool), visit_i8(i8), visit_i16(i16), visit_i32(i32), visit_i64(i64), visit_i128(i128),
        visit_u8(u8), visit_u16(u16), visit_u32(u32), visit_u64(u64), visit_u128(u128),
        visit_f32(f32), visit_f64(f64), visit_char(char),
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<V::Value, E> {
        match self.interpolated::<E>(value)? {
            Some(text) => self.typed(text),
            None => match self.written_bool(value) {
                Some(flag) => self.visitor.visit_bool(flag),
                None => self.visitor.visit_str(value),
            },
        }
    }

    fn visit_borrowed_str<E: de::Error>(self, value: &'de str) -> Result<V::Value, E> {
        match self.interpolated::<E>(value)? {
            Some(text) => self.typed(text),
            None => match self.written_bool(value) {
                Some(flag) => self.visitor.visit_bool(flag),
                None => self.visitor.visit_borrowed_str(value),
            },
        }
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<V::Value, E> {
        match self.interpolated::<E>(&value)? {
            Some(text) => self.typed(text),
            None => match self.written_bool(&value) {
                Some(flag) => self.visitor.visit_bool(flag),
                None => self.visitor.visit_string(value),
            },
        }
    }

    fn visit_bytes<E: de::Error>(self, value: &[u8]) -> Result<V::Value, E> {
        self.visitor.visit_bytes(value)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, value: &'de [u8]) -> Result<V::Value, E> {
        self.visitor.visit_borrowed_bytes(value)
    }

    fn visit_byte_buf<E: de::Error>(self, value: Vec<u8>) -> Result<V::Value, E> {
        self.visitor.visit_byte_buf(value)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(Interpolating { inner: deserializer, scope: self.scope, role: self.role })
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_newtype_struct(Interpolating { inner: deserializer, scope: self.scope, role: self.role })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_seq(Seq { inner: seq, scope: self.scope, index: 0 })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(Map { inner: map, scope: self.scope })
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(Enum { inner: data, scope: self.scope })
    }
}

/// A seed whose deserializer is wrapped.
struct Seed<'c, S> {
    seed: S,
    scope: Scope<'c>,
    role: Role,
}

impl<'de, 'c, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'c, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Interpolating { inner: deserializer, scope: self.scope, role: self.role })
    }
}

/// Runs `f` with `segment` pushed on the current path.
fn at<T>(scope: Scope<'_>, segment: String, f: impl FnOnce() -> T) -> T {
    scope.walk.borrow_mut().path.push(segment);
    let result = f();
    scope.walk.borrow_mut().path.pop();
    result
}

struct Seq<'c, A> {
    inner: A,
    scope: Scope<'c>,
    index: usize,
}

impl<'de, 'c, A: SeqAccess<'de>> SeqAccess<'de> for Seq<'c, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        let (scope, index) = (self.scope, self.index);
        self.index += 1;
        at(scope, format!("[{index}]"), || self.inner.next_element_seed(Seed { seed, scope, role: Role::Value }))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

struct Map<'c, A> {
    inner: A,
    scope: Scope<'c>,
}

impl<'de, 'c, A: MapAccess<'de>> MapAccess<'de> for Map<'c, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.scope.walk.borrow_mut().pending_key = None;
        self.inner.next_key_seed(Seed { seed, scope: self.scope, role: Role::Key })
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        let scope = self.scope;
        let key = scope.walk.borrow_mut().pending_key.take().unwrap_or_else(|| "?".to_owned());
        at(scope, key, || self.inner.next_value_seed(Seed { seed, scope, role: Role::Value }))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

struct Enum<'c, A> {
    inner: A,
    scope: Scope<'c>,
}

impl<'de, 'c, A: EnumAccess<'de>> EnumAccess<'de> for Enum<'c, A> {
    type Error = A::Error;
    type Variant = Variant<'c, A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self::Variant), A::Error> {
        let scope = self.scope;
        let (value, variant) = self.inner.variant_seed(Seed { seed, scope, role: Role::Value })?;
        Ok((value, Variant { inner: variant, scope }))
    }
}

struct Variant<'c, A> {
    inner: A,
    scope: Scope<'c>,
}

impl<'de, 'c, A: VariantAccess<'de>> VariantAccess<'de> for Variant<'c, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.inner.newtype_variant_seed(Seed { seed, scope: self.scope, role: Role::Value })
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.inner.tuple_variant(len, Visit { visitor, scope: self.scope, role: Role::Value, hint: Hint::Any })
    }

    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value, A::Error> {
        self.inner.struct_variant(fields, Visit { visitor, scope: self.scope, role: Role::Value, hint: Hint::Any })
    }
}
