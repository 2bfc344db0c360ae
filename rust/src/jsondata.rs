//! The tensor numbers of a large JSON inference request, found and parsed without Python.
//!
//! Why: a JSON request carrying millions of numbers took the GIL for its whole parse (orjson
//! builds a Python object per number, then numpy reads them back), a quarter of a second for
//! 24 MiB, and every other client waited that long. Here the `inputs[k].data` arrays are
//! located in the document ([`locate_input_data`]) so that Python parses only the rest, and
//! each array's numbers are parsed straight into a typed buffer ([`parse_numbers`]), both
//! without the GIL.
//!
//! Only the common case is taken on: an array whose elements are all numbers of the kind the
//! input's datatype needs, nested in any way. Anything else (strings, booleans, numbers out
//! of range, member names written with escapes, duplicated members) is left to the general
//! path, which words its errors as Triton does.

/// `(k, start, end)` for each `inputs[k].data` array of `doc`, a document the scanner
/// ([`crate::jsonscan::scan`]) accepted, cut at its end. An input is left out (the general path
/// reads it) unless its object names `data` exactly once and no member name in it has an
/// escape; none are found when the root object's names have an escape or `inputs` twice.
pub fn locate_input_data(doc: &[u8]) -> Vec<(usize, usize, usize)> {
    let mut walker = Walker { b: doc, i: 0 };
    walker.root().unwrap_or_default()
}

struct Walker<'a> {
    b: &'a [u8],
    i: usize,
}

impl Walker<'_> {
    fn peek(&self) -> u8 {
        self.b.get(self.i).copied().unwrap_or(0)
    }

    fn ws(&mut self) {
        while matches!(self.peek(), b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    /// Expects `byte` (after blanks) and steps over it; None when it is not there.
    fn expect(&mut self, byte: u8) -> Option<()> {
        self.ws();
        (self.peek() == byte).then(|| self.i += 1)
    }

    /// A member name and its colon: (the name's bytes between the quotes, whether it has an
    /// escape).
    fn name(&mut self) -> Option<(usize, usize, bool)> {
        self.expect(b'"')?;
        let start = self.i;
        let mut escaped = false;
        loop {
            match self.peek() {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    self.i += 2;
                }
                0 if self.i >= self.b.len() => return None,
                _ => self.i += 1,
            }
        }
        let end = self.i;
        self.i += 1;
        self.expect(b':')?;
        self.ws();
        Some((start, end, escaped))
    }

    fn is(&self, (start, end, escaped): (usize, usize, bool), word: &[u8]) -> bool {
        !escaped && &self.b[start..end] == word
    }

    /// Steps over one value (the document is valid: only its brackets and strings matter).
    fn skip_value(&mut self) -> Option<()> {
        self.ws();
        let mut depth = 0usize;
        loop {
            match self.peek() {
                b'"' => self.skip_string()?,
                b'[' | b'{' => {
                    depth += 1;
                    self.i += 1;
                }
                b']' | b'}' => {
                    depth = depth.checked_sub(1)?;
                    self.i += 1;
                }
                0 if self.i >= self.b.len() => return (depth == 0).then_some(()),
                _ if depth == 0 => {
                    // A number or literal: up to the next delimiter.
                    while !matches!(
                        self.peek(),
                        b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r' | 0
                    ) {
                        self.i += 1;
                    }
                    return Some(());
                }
                _ => self.i += 1,
            }
            if depth == 0 {
                return Some(());
            }
        }
    }

    fn skip_string(&mut self) -> Option<()> {
        self.i += 1;
        loop {
            match self.peek() {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => self.i += 2,
                0 if self.i >= self.b.len() => return None,
                _ => self.i += 1,
            }
        }
    }

    /// Calls `member(walker, name)` for each member of the object at the cursor; the callback
    /// steps over the member's value.
    fn members(
        &mut self,
        mut member: impl FnMut(&mut Self, (usize, usize, bool)) -> Option<()>,
    ) -> Option<()> {
        self.expect(b'{')?;
        self.ws();
        if self.peek() == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let name = self.name()?;
            member(self, name)?;
            self.ws();
            match self.peek() {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn root(&mut self) -> Option<Vec<(usize, usize, usize)>> {
        let mut found = Vec::new();
        let mut inputs_seen = 0;
        let mut root_escape = false;
        self.members(|walker, name| {
            root_escape |= name.2;
            if walker.is(name, b"inputs") {
                inputs_seen += 1;
                if walker.peek() == b'[' {
                    found = walker.inputs()?;
                    return Some(());
                }
            }
            walker.skip_value()
        })?;
        Some(if root_escape || inputs_seen != 1 {
            Vec::new()
        } else {
            found
        })
    }

    /// The `inputs` array at the cursor: its inputs' data arrays.
    fn inputs(&mut self) -> Option<Vec<(usize, usize, usize)>> {
        let mut found = Vec::new();
        self.expect(b'[')?;
        self.ws();
        if self.peek() == b']' {
            self.i += 1;
            return Some(found);
        }
        for k in 0.. {
            self.ws();
            if self.peek() == b'{' {
                let mut data = None;
                let mut datas = 0;
                let mut escape = false;
                self.members(|walker, name| {
                    escape |= name.2;
                    let start = walker.i;
                    if walker.is(name, b"data") {
                        datas += 1;
                    }
                    walker.skip_value()?;
                    if walker.is(name, b"data") && walker.b[start] == b'[' {
                        data = Some((k, start, walker.i));
                    }
                    Some(())
                })?;
                if let (Some(range), 1, false) = (data, datas, escape) {
                    found.push(range);
                }
            } else {
                self.skip_value()?;
            }
            self.ws();
            match self.peek() {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    break;
                }
                _ => return None,
            }
        }
        Some(found)
    }
}

/// The kind of number an input's datatype needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberKind {
    /// Any number, as a double (integers converted as Python converts its integers).
    Float,
    /// Integers within `i64`.
    Signed,
    /// Integers within `u64`, none negative.
    Unsigned,
}

/// The numbers of a JSON array (nested in any way), in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Numbers {
    Float(Vec<f64>),
    Signed(Vec<i64>),
    Unsigned(Vec<u64>),
}

/// The numbers of `array` (a valid JSON array's bytes) flattened, as `kind`; None when an
/// element is not a number of that kind (a string, a literal, an integer out of range, a
/// fraction where an integer is needed, a double that overflows).
pub fn parse_numbers(array: &[u8], kind: NumberKind) -> Option<Numbers> {
    // About one number per two bytes at the densest: reserve for a typical spread instead.
    let guess = array.len() / 4;
    let mut numbers = match kind {
        NumberKind::Float => Numbers::Float(Vec::with_capacity(guess)),
        NumberKind::Signed => Numbers::Signed(Vec::with_capacity(guess)),
        NumberKind::Unsigned => Numbers::Unsigned(Vec::with_capacity(guess)),
    };
    let mut i = 0;
    while i < array.len() {
        match array[i] {
            b'[' | b']' | b',' | b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'-' | b'0'..=b'9' => {
                let start = i;
                let mut integer = true;
                while i < array.len() {
                    match array[i] {
                        b'0'..=b'9' | b'-' | b'+' => {}
                        b'.' | b'e' | b'E' => integer = false,
                        _ => break,
                    }
                    i += 1;
                }
                // Number tokens are ASCII.
                let token = std::str::from_utf8(&array[start..i]).ok()?;
                match &mut numbers {
                    Numbers::Float(values) => values.push(as_double(token, integer)?),
                    Numbers::Signed(values) if integer => values.push(token.parse().ok()?),
                    Numbers::Unsigned(values) if integer => values.push(token.parse().ok()?),
                    _ => return None,
                }
            }
            _ => return None,
        }
    }
    Some(numbers)
}

/// A JSON number as Python makes it a double: an integer through Python's `int` (so `-0` is
/// 0.0), a fraction as the nearest double; None past the double range.
fn as_double(token: &str, integer: bool) -> Option<f64> {
    if integer && let Ok(value) = token.parse::<i64>() {
        #[allow(clippy::cast_precision_loss)] // rounds to nearest, as Python's int to float
        return Some(value as f64);
    }
    let value: f64 = token.parse().ok()?;
    value.is_finite().then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn located(doc: &str) -> Vec<(usize, &str)> {
        locate_input_data(doc.as_bytes())
            .into_iter()
            .map(|(k, start, end)| (k, &doc[start..end]))
            .collect()
    }

    #[test]
    fn finds_each_inputs_data_array() {
        let doc = r#"{"id":"a[","inputs":[{"name":"x","data":[1,[2,3]],"shape":[3]},
            {"name":"y","parameters":{"binary_data_size":4}},
            {"data" : [ "s" ] }, 7, {"data":5}],"outputs":[{"data":[9]}]}"#;
        assert_eq!(located(doc), vec![(0, "[1,[2,3]]"), (2, r#"[ "s" ]"#)]);
    }

    #[test]
    fn leaves_ambiguous_inputs_to_the_general_path() {
        // Two members named data, one spelled with an escape, or a root with two inputs.
        assert!(located(r#"{"inputs":[{"data":[1],"data":[2]}]}"#).is_empty());
        assert!(located(r#"{"inputs":[{"data":[1],"d\u0061ta":[2]}]}"#).is_empty());
        assert!(located(r#"{"inputs":[{"data":[1]}],"inputs":[]}"#).is_empty());
        assert!(located(r#"{"inputs":[{"data":[1]}],"\u0069nputs":[]}"#).is_empty());
        assert!(located(r"[1,2]").is_empty());
        assert_eq!(
            located(r#"{"inputs":[{"data":[1]},{"data":[2],"data":[3]}]}"#).len(),
            1
        );
    }

    #[test]
    fn parses_numbers_of_each_kind() {
        let array = b"[1, -2,[3.5e1, 0.25],-0]";
        assert_eq!(
            parse_numbers(array, NumberKind::Float),
            Some(Numbers::Float(vec![1.0, -2.0, 35.0, 0.25, 0.0]))
        );
        assert!(matches!(
            parse_numbers(b"[-0]", NumberKind::Float),
            Some(Numbers::Float(v)) if v[0].is_sign_positive()
        ));
        assert!(matches!(
            parse_numbers(b"[-0.0]", NumberKind::Float),
            Some(Numbers::Float(v)) if v[0].is_sign_negative()
        ));
        assert_eq!(parse_numbers(array, NumberKind::Signed), None);
        assert_eq!(
            parse_numbers(b"[[1,-2],[9223372036854775807]]", NumberKind::Signed),
            Some(Numbers::Signed(vec![1, -2, i64::MAX]))
        );
        assert_eq!(
            parse_numbers(b"[18446744073709551615]", NumberKind::Unsigned),
            Some(Numbers::Unsigned(vec![u64::MAX]))
        );
        assert_eq!(
            parse_numbers(b"[12345678901234567890123]", NumberKind::Float),
            Some(Numbers::Float(vec![1.234_567_890_123_456_8e22]))
        );
    }

    #[test]
    fn refuses_what_the_general_path_must_word() {
        for (array, kind) in [
            (&b"[1,\"2\"]"[..], NumberKind::Float),
            (b"[true]", NumberKind::Float),
            (b"[1e400]", NumberKind::Float),
            (b"[9223372036854775808]", NumberKind::Signed),
            (b"[-1]", NumberKind::Unsigned),
            (b"[18446744073709551616]", NumberKind::Unsigned),
            (b"[1.5]", NumberKind::Signed),
            (b"[{}]", NumberKind::Float),
        ] {
            assert_eq!(parse_numbers(array, kind), None, "{array:?}");
        }
    }
}
