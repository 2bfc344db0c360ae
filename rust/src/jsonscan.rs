//! Checks a JSON document against `RapidJSON`'s grammar (Triton's parser) and finds its first
//! error with `RapidJSON`'s wording and byte offset.
//!
//! Why here: the HTTP frontend must word a malformed request body exactly as Triton does, and
//! the first error of a large body may lie megabytes in. Scanning it in Python held the GIL for
//! seconds, and every other client waited; here it runs without the GIL at memory speed and
//! allocates nothing but the stack of open containers.

/// What `RapidJSON` calls the error (its `GetParseError_En` texts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonError {
    Empty,
    NotSingular,
    ValueInvalid,
    MissName,
    MissColon,
    MissCommaOrCurly,
    MissCommaOrSquare,
    BadHex,
    BadSurrogate,
    BadEscape,
    MissQuote,
    BadEncoding,
    MissFraction,
    MissExponent,
}

impl JsonError {
    /// `RapidJSON`'s message for it.
    #[must_use]
    pub fn message(self) -> &'static str {
        match self {
            Self::Empty => "The document is empty.",
            Self::NotSingular => "The document root must not be followed by other values.",
            Self::ValueInvalid => "Invalid value.",
            Self::MissName => "Missing a name for object member.",
            Self::MissColon => "Missing a colon after a name of object member.",
            Self::MissCommaOrCurly => "Missing a comma or '}' after an object member.",
            Self::MissCommaOrSquare => "Missing a comma or ']' after an array element.",
            Self::BadHex => "Incorrect hex digit after \\u escape in string.",
            Self::BadSurrogate => "The surrogate pair in string is invalid.",
            Self::BadEscape => "Invalid escape character in string.",
            Self::MissQuote => "Missing a closing quotation mark in string.",
            Self::BadEncoding => "Invalid encoding in string.",
            Self::MissFraction => "Miss fraction part in number.",
            Self::MissExponent => "Miss exponent in number.",
        }
    }
}

/// The first error and the byte offset `RapidJSON` reports it at.
pub type ScanError = (JsonError, usize);

/// Checks `b` as one JSON document; `Ok` holds where the document ends (`RapidJSON` stops at a
/// NUL byte, which counts as the end of the input).
///
/// # Errors
/// The first error `RapidJSON` would report, at its offset.
pub fn scan(b: &[u8]) -> Result<usize, ScanError> {
    Scanner { b }.document()
}

/// A stack of bits, one per open container: a body of nothing but opening brackets needs an
/// eighth of its size here, not its size again.
#[derive(Default)]
struct Nesting {
    words: Vec<u64>,
    depth: usize,
}

impl Nesting {
    fn push(&mut self, object: bool) {
        let (word, bit) = (self.depth / 64, self.depth % 64);
        if word == self.words.len() {
            self.words.push(0);
        }
        if object {
            self.words[word] |= 1 << bit;
        } else {
            self.words[word] &= !(1 << bit);
        }
        self.depth += 1;
    }

    fn pop(&mut self) {
        self.depth -= 1;
    }

    fn last(&self) -> Option<bool> {
        let top = self.depth.checked_sub(1)?;
        Some(self.words[top / 64] >> (top % 64) & 1 == 1)
    }
}

struct Scanner<'a> {
    b: &'a [u8],
}

impl Scanner<'_> {
    /// The byte at `i`, or 0 past the end (`RapidJSON` reads a NUL there).
    fn peek(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    fn ws(&self, mut i: usize) -> usize {
        while matches!(self.peek(i), b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    /// At the start of an object member: its name, the colon, the blanks before its value.
    fn member_name(&self, i: usize) -> Result<usize, ScanError> {
        if self.peek(i) != b'"' {
            return Err((JsonError::MissName, i));
        }
        let i = self.ws(self.string(i)?);
        if self.peek(i) != b':' {
            return Err((JsonError::MissColon, i));
        }
        Ok(self.ws(i + 1))
    }

    fn document(&self) -> Result<usize, ScanError> {
        let mut i = self.ws(0);
        if self.peek(i) == 0 {
            return Err((JsonError::Empty, i));
        }
        // The open containers, innermost last: true for an object, false for an array.
        let mut open = Nesting::default();
        loop {
            // One value starting at i.
            match self.peek(i) {
                b'{' => {
                    i = self.ws(i + 1);
                    if self.peek(i) == b'}' {
                        i += 1;
                    } else {
                        i = self.member_name(i)?;
                        open.push(true);
                        continue;
                    }
                }
                b'[' => {
                    i = self.ws(i + 1);
                    if self.peek(i) == b']' {
                        i += 1;
                    } else {
                        open.push(false);
                        continue;
                    }
                }
                b'"' => i = self.string(i)?,
                b'n' => i = self.literal(i, b"null")?,
                b't' => i = self.literal(i, b"true")?,
                b'f' => i = self.literal(i, b"false")?,
                _ => i = self.number(i)?,
            }
            // The value is complete: close finished containers, or go on to the next element.
            loop {
                i = self.ws(i);
                let Some(in_object) = open.last() else {
                    if self.peek(i) != 0 {
                        return Err((JsonError::NotSingular, i));
                    }
                    return Ok(i);
                };
                match (self.peek(i), in_object) {
                    (b',', true) => {
                        i = self.member_name(self.ws(i + 1))?;
                        break;
                    }
                    (b',', false) => {
                        i = self.ws(i + 1);
                        break;
                    }
                    (b'}', true) | (b']', false) => {
                        open.pop();
                        i += 1;
                    }
                    (_, true) => return Err((JsonError::MissCommaOrCurly, i)),
                    (_, false) => return Err((JsonError::MissCommaOrSquare, i)),
                }
            }
        }
    }

    fn literal(&self, mut i: usize, word: &[u8]) -> Result<usize, ScanError> {
        i += 1;
        for &expected in &word[1..] {
            if self.b.get(i) != Some(&expected) {
                return Err((JsonError::ValueInvalid, i));
            }
            i += 1;
        }
        Ok(i)
    }

    fn digits(&self, mut i: usize) -> usize {
        while self.peek(i).is_ascii_digit() {
            i += 1;
        }
        i
    }

    fn number(&self, mut i: usize) -> Result<usize, ScanError> {
        if self.peek(i) == b'-' {
            i += 1;
        }
        match self.peek(i) {
            b'0' => i += 1, // a leading zero stands alone
            b'1'..=b'9' => i = self.digits(i),
            _ => return Err((JsonError::ValueInvalid, i)),
        }
        if self.peek(i) == b'.' {
            i += 1;
            if !self.peek(i).is_ascii_digit() {
                return Err((JsonError::MissFraction, i));
            }
            i = self.digits(i);
        }
        if matches!(self.peek(i), b'e' | b'E') {
            i += 1;
            if matches!(self.peek(i), b'+' | b'-') {
                i += 1;
            }
            if !self.peek(i).is_ascii_digit() {
                return Err((JsonError::MissExponent, i));
            }
            i = self.digits(i);
        }
        Ok(i)
    }

    /// Four hex digits at `i` as a code unit; an error names the escape at `escape_at`.
    fn hex4(&self, i: usize, escape_at: usize) -> Result<(u32, usize), ScanError> {
        let digits = self.b.get(i..i + 4).ok_or((JsonError::BadHex, escape_at))?;
        let mut code = 0;
        for &digit in digits {
            let value = char::from(digit)
                .to_digit(16)
                .ok_or((JsonError::BadHex, escape_at))?;
            code = code * 16 + value;
        }
        Ok((code, i + 4))
    }

    /// The string whose opening quote is at `i`; returns the index after its closing quote.
    fn string(&self, mut i: usize) -> Result<usize, ScanError> {
        i += 1;
        loop {
            match self.peek(i) {
                b'"' => return Ok(i + 1),
                b'\\' => {
                    let escape_at = i;
                    match self.peek(i + 1) {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                        b'u' => {
                            let (code, next) = self.hex4(i + 2, escape_at)?;
                            i = next;
                            if (0xD800..=0xDBFF).contains(&code) {
                                if !(self.peek(i) == b'\\' && self.peek(i + 1) == b'u') {
                                    return Err((JsonError::BadSurrogate, escape_at));
                                }
                                let (low, next) = self.hex4(i + 2, escape_at)?;
                                i = next;
                                if !(0xDC00..=0xDFFF).contains(&low) {
                                    return Err((JsonError::BadSurrogate, escape_at));
                                }
                            } else if (0xDC00..=0xDFFF).contains(&code) {
                                return Err((JsonError::BadSurrogate, escape_at));
                            }
                        }
                        _ => return Err((JsonError::BadEscape, escape_at)),
                    }
                }
                c if c < 0x20 => {
                    // The end of the input reads as a NUL, and `RapidJSON` stops at a NUL.
                    let error = if c == 0 {
                        JsonError::MissQuote
                    } else {
                        JsonError::BadEncoding
                    };
                    return Err((error, i));
                }
                _ => i += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> ScanError {
        scan(text.as_bytes()).expect_err(text)
    }

    #[test]
    fn accepts_documents_and_says_where_they_end() {
        assert_eq!(
            scan(br#" {"a": [1, -2.5e3, "x\u00e9", true, null, {}], "b": []} "#),
            Ok(56)
        );
        assert_eq!(scan(b"0"), Ok(1));
        assert_eq!(scan(b"[1]\0junk"), Ok(3)); // a NUL ends the input
        assert_eq!(scan(r#""\ud83d\ude00""#.as_bytes()), Ok(14));
    }

    #[test]
    fn words_errors_as_rapidjson_at_its_offsets() {
        assert_eq!(error(""), (JsonError::Empty, 0));
        assert_eq!(error("  "), (JsonError::Empty, 2));
        assert_eq!(error("{} x"), (JsonError::NotSingular, 3));
        assert_eq!(error("x"), (JsonError::ValueInvalid, 0));
        assert_eq!(error("nul"), (JsonError::ValueInvalid, 3));
        assert_eq!(error("{1}"), (JsonError::MissName, 1));
        assert_eq!(error(r#"{"a" 1}"#), (JsonError::MissColon, 5));
        assert_eq!(error(r#"{"a":1 "b"}"#), (JsonError::MissCommaOrCurly, 7));
        assert_eq!(error("[1 2]"), (JsonError::MissCommaOrSquare, 3));
        assert_eq!(error("[1,]"), (JsonError::ValueInvalid, 3));
        assert_eq!(error(r#""\u12x4""#), (JsonError::BadHex, 1));
        assert_eq!(error(r#""\ud800x""#), (JsonError::BadSurrogate, 1));
        assert_eq!(error(r#""\udc00""#), (JsonError::BadSurrogate, 1));
        assert_eq!(error(r#""\q""#), (JsonError::BadEscape, 1));
        assert_eq!(error(r#""abc"#), (JsonError::MissQuote, 4));
        assert_eq!(error("\"a\u{1}\""), (JsonError::BadEncoding, 2));
        assert_eq!(error("1."), (JsonError::MissFraction, 2));
        assert_eq!(error("1e+"), (JsonError::MissExponent, 3));
        assert_eq!(error("01"), (JsonError::NotSingular, 1));
    }

    #[test]
    fn keeps_track_of_deep_mixed_nesting() {
        let mut body = Vec::new();
        for level in 0..200 {
            body.extend_from_slice(if level % 3 == 0 { b"{\"k\":" } else { b"[" });
        }
        body.push(b'1');
        for level in (0..200).rev() {
            body.push(if level % 3 == 0 { b'}' } else { b']' });
        }
        assert_eq!(scan(&body), Ok(body.len()));
        let last = body.len() - 1; // the outermost object closed with a bracket
        body[last] = b']';
        assert_eq!(scan(&body), Err((JsonError::MissCommaOrCurly, last)));
    }

    #[test]
    fn finds_an_error_at_the_end_of_a_large_document() {
        let mut body = b"{\"data\":[".to_vec();
        for _ in 0..1_000_000 {
            body.extend_from_slice(b"1,");
        }
        body.extend_from_slice(b"]}");
        assert_eq!(scan(&body), Err((JsonError::ValueInvalid, body.len() - 2)));
    }
}
