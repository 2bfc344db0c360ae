//! A small JSON tree over a request's header, for the documents the fast path takes on.
//!
//! The header of an inference request is small (the tensors travel as binary data or are
//! parsed straight into typed buffers, see [`crate::jsondata`]), so a tree of borrowed slices
//! is cheap. It is built only for a document [`crate::jsonscan::scan`] accepted, and it reads
//! only what the fast path understands: strings without escapes (member names, ids, tensor
//! names are plain in practice) and numbers kept as their text. Anything else (an escape, a
//! member named twice in one object, invalid UTF-8) makes [`parse`] give up, and the request
//! takes the reference path, which reads every JSON document as Triton does.

/// A JSON value whose strings and numbers borrow the document's bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    /// A number's text, as written.
    Number(&'a str),
    Str(&'a str),
    /// An array's elements, and the array's bytes (brackets included).
    Array(Vec<Value<'a>>, &'a [u8]),
    /// An object's members in order; no name appears twice.
    Object(Vec<(&'a str, Value<'a>)>),
}

impl<'a> Value<'a> {
    /// The member named `name` of an object.
    pub fn get(&self, name: &str) -> Option<&Value<'a>> {
        match self {
            Value::Object(members) => members.iter().find(|(n, _)| *n == name).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Deepest nesting the tree follows; a deeper header is not one the fast path takes on.
const MAX_DEPTH: usize = 64;

/// The tree of `doc`, a document the scanner accepted, followed by nothing but white space;
/// None when it holds anything the fast path leaves to the reference path.
pub fn parse(doc: &[u8]) -> Option<Value<'_>> {
    let mut reader = Reader { b: doc, i: 0 };
    let value = reader.value(0)?;
    reader.blank();
    (reader.i == doc.len()).then_some(value)
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn blank(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.blank();
        (self.b.get(self.i) == Some(&byte)).then(|| self.i += 1)
    }

    fn literal(&mut self, text: &[u8], value: Value<'a>) -> Option<Value<'a>> {
        self.b[self.i..].starts_with(text).then(|| {
            self.i += text.len();
            value
        })
    }

    fn value(&mut self, depth: usize) -> Option<Value<'a>> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.blank();
        match *self.b.get(self.i)? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string().map(Value::Str),
            b't' => self.literal(b"true", Value::Bool(true)),
            b'f' => self.literal(b"false", Value::Bool(false)),
            b'n' => self.literal(b"null", Value::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn number(&mut self) -> Option<Value<'a>> {
        let start = self.i;
        while self.i < self.b.len()
            && matches!(
                self.b[self.i],
                b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'
            )
        {
            self.i += 1;
        }
        std::str::from_utf8(&self.b[start..self.i])
            .ok()
            .map(Value::Number)
    }

    /// A string without escapes, in valid UTF-8.
    fn string(&mut self) -> Option<&'a str> {
        self.i += 1; // the opening quote
        let start = self.i;
        let rest = &self.b[start..];
        let end = rest.iter().position(|&c| c == b'"' || c == b'\\')?;
        if rest[end] == b'\\' {
            return None;
        }
        self.i = start + end + 1;
        std::str::from_utf8(&rest[..end]).ok()
    }

    fn array(&mut self, depth: usize) -> Option<Value<'a>> {
        let start = self.i;
        self.i += 1;
        let mut items = Vec::new();
        self.blank();
        if self.b.get(self.i) == Some(&b']') {
            self.i += 1;
        } else {
            loop {
                items.push(self.value(depth + 1)?);
                self.blank();
                match self.b.get(self.i)? {
                    b',' => self.i += 1,
                    b']' => {
                        self.i += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        Some(Value::Array(items, &self.b[start..self.i]))
    }

    fn object(&mut self, depth: usize) -> Option<Value<'a>> {
        self.i += 1;
        let mut members: Vec<(&'a str, Value<'a>)> = Vec::new();
        self.blank();
        if self.b.get(self.i) == Some(&b'}') {
            self.i += 1;
            return Some(Value::Object(members));
        }
        loop {
            self.blank();
            if self.b.get(self.i) != Some(&b'"') {
                return None;
            }
            let name = self.string()?;
            if members.iter().any(|(n, _)| *n == name) {
                return None; // which one counts differs between parsers: not ours to decide
            }
            self.eat(b':')?;
            let value = self.value(depth + 1)?;
            members.push((name, value));
            self.blank();
            match self.b.get(self.i)? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(Value::Object(members));
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_plain_documents() {
        let doc = br#" {"a": [1, -2.5e3, true, null], "b": {"c": "d"}} "#;
        let value = parse(doc).unwrap();
        let Some(Value::Array(items, text)) = value.get("a") else {
            panic!("no array")
        };
        assert_eq!(items[1], Value::Number("-2.5e3"));
        assert_eq!(*text, &b"[1, -2.5e3, true, null]"[..]);
        assert_eq!(value.get("b").unwrap().get("c"), Some(&Value::Str("d")));
    }

    #[test]
    fn leaves_escapes_duplicates_and_trailing_bytes_to_the_reference_path() {
        assert_eq!(parse(br#"{"a\n": 1}"#), None);
        assert_eq!(parse(br#"{"a": 1, "a": 2}"#), None);
        assert_eq!(parse(br#"{"a": 1} x"#), None);
        assert_eq!(parse(b"{\"a\": \"\xff\"}"), None);
        let deep = "[".repeat(MAX_DEPTH + 2) + &"]".repeat(MAX_DEPTH + 2);
        assert_eq!(parse(deep.as_bytes()), None);
    }
}
