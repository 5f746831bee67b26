//! Tokens of MLIR text, as far as the Mosaic subset needs them.

use crate::EvalError;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// `%name`, `%name#3`.
    Value(String),
    /// `@name` (or `@"quoted"`).
    Sym(String),
    /// A bare identifier, dots included: `arith.addf`, `i32`, `true`, `to`.
    Ident(String),
    /// A keyword or `#attribute` immediately followed by `<...>`: `vector<8x128xf32>`,
    /// `#tpu.memory_space<vmem>`, `dense<0.0e0>`, `array<i64: 1, 2>`. Holds the name and the
    /// text between the outer angle brackets.
    Angle(String, String),
    /// A number as written (integer, float or `0x` hex).
    Num(String),
    Str(String),
    /// One of `( ) { } [ ] , : = < > ->`.
    Punct(&'static str),
}

pub(crate) struct Lexed {
    pub toks: Vec<Tok>,
    /// The line of each token (1-based), for messages.
    pub lines: Vec<usize>,
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$')
}

pub(crate) fn lex(text: &str) -> Result<Lexed, EvalError> {
    let chars: Vec<char> = text.chars().collect();
    let mut toks = Vec::new();
    let mut lines = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let err = |line: usize, msg: String| EvalError::Parse { line, message: msg };
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        let start = i;
        let tok = match c {
            '%' => {
                i += 1;
                while i < chars.len() && (ident_char(chars[i]) || matches!(chars[i], '#' | '-')) {
                    i += 1;
                }
                Tok::Value(chars[start..i].iter().collect())
            }
            '@' => {
                i += 1;
                if chars.get(i) == Some(&'"') {
                    let (s, next) = string(&chars, i).map_err(|e| err(line, e.to_string()))?;
                    i = next;
                    Tok::Sym(s)
                } else {
                    while i < chars.len() && ident_char(chars[i]) {
                        i += 1;
                    }
                    Tok::Sym(chars[start + 1..i].iter().collect())
                }
            }
            '"' => {
                let (s, next) = string(&chars, i).map_err(|e| err(line, e.to_string()))?;
                i = next;
                Tok::Str(s)
            }
            '-' if chars.get(i + 1) == Some(&'>') => {
                i += 2;
                Tok::Punct("->")
            }
            c if c.is_ascii_digit()
                || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                i += 1;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric()
                        || chars[i] == '.'
                        || ((chars[i] == '-' || chars[i] == '+')
                            && matches!(chars[i - 1], 'e' | 'E')
                            && !chars[start..i].contains(&'x')))
                {
                    i += 1;
                }
                Tok::Num(chars[start..i].iter().collect())
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == '#' => {
                i += 1;
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                if chars.get(i) == Some(&'<') {
                    let mut depth = 0;
                    let open = i;
                    loop {
                        match chars.get(i) {
                            Some('<') => depth += 1,
                            Some('>') if chars[i - 1] != '-' => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            Some('\n') => line += 1,
                            Some(_) => {}
                            None => return Err(err(line, format!("unclosed `<` after `{name}`"))),
                        }
                        i += 1;
                    }
                    i += 1;
                    Tok::Angle(name, chars[open + 1..i - 1].iter().collect())
                } else if name.starts_with('#') {
                    return Err(err(line, format!("attribute `{name}` has no `<...>` body")));
                } else {
                    Tok::Ident(name)
                }
            }
            _ => {
                i += 1;
                Tok::Punct(match c {
                    '(' => "(",
                    ')' => ")",
                    '{' => "{",
                    '}' => "}",
                    '[' => "[",
                    ']' => "]",
                    ',' => ",",
                    ':' => ":",
                    '=' => "=",
                    '<' => "<",
                    '>' => ">",
                    other => return Err(err(line, format!("unexpected character `{other}`"))),
                })
            }
        };
        toks.push(tok);
        lines.push(line);
    }
    Ok(Lexed { toks, lines })
}

/// A `"..."` string starting at `i`; returns it unescaped and the index after it.
fn string(chars: &[char], mut i: usize) -> Result<(String, usize), StringError> {
    let mut s = String::new();
    i += 1;
    loop {
        match chars.get(i) {
            Some('"') => return Ok((s, i + 1)),
            Some('\\') => {
                match (chars.get(i + 1), chars.get(i + 2)) {
                    (Some(c @ ('"' | '\\')), _) => s.push(*c),
                    (Some('n'), _) => s.push('\n'),
                    (Some('t'), _) => s.push('\t'),
                    // Two hex digits: a byte (MLIR escapes other control characters so).
                    (Some(hi), Some(lo)) if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => {
                        let byte = hi.to_digit(16).unwrap_or(0) * 16 + lo.to_digit(16).unwrap_or(0);
                        s.push(char::from_u32(byte).unwrap_or('?'));
                        i += 1;
                    }
                    (other, _) => {
                        return Err(StringError::Escape {
                            escape: other.copied(),
                        })
                    }
                }
                i += 2;
            }
            Some(c) => {
                s.push(*c);
                i += 1;
            }
            None => return Err(StringError::Unclosed),
        }
    }
}

/// Why a `"..."` string could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum StringError {
    #[error("unsupported escape `\\{escape:?}` in a string")]
    Escape { escape: Option<char> },
    #[error("unclosed string")]
    Unclosed,
}
