//! GBNF, llama.cpp's grammar format (its `grammar` request field), rewritten as the Lark-like syntax the
//! grammar engine reads. It owns the reading of GBNF and nothing of its meaning: every GBNF construct has a
//! direct Lark counterpart, so the rewrite is a translation, rule for rule.
//!
//! ```text
//! GBNF                          Lark (llguidance)
//! root ::= "a" item* | [0-9]    start: r-root
//!                               r-root: "a" r-item* | /[\x{30}-\x{39}]/
//! .                             /(?s:.)/
//! x{2,5}                        x{2,5}
//! ```
//!
//! Rule names become `r-` and the name lowercased (a numeric suffix keeps names apart that differ only in
//! case); literals are written with JSON escapes and character classes with every character as `\x{..}`, so
//! no character of the source can change the meaning of the output. Errors name the line and what was
//! expected.

use std::collections::HashMap;
use std::fmt::Write;

/// A GBNF text that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("grammar line {line}: {what}")]
pub struct GbnfError {
    pub line: usize,
    pub what: String,
}

/// The Lark text of a GBNF grammar whose start rule is `root`.
pub fn to_lark(src: &str) -> Result<String, GbnfError> {
    let mut p = Reader { s: src.as_bytes(), src, pos: 0, names: HashMap::new() };
    let mut rules: Vec<(String, String)> = Vec::new();
    let mut defined: Vec<String> = Vec::new();
    loop {
        p.skip_space(true);
        if p.at_end() {
            break;
        }
        let name = p.name()?;
        p.skip_space(false);
        if !p.eat("::=") {
            return Err(p.err(format!("expected ::= after the rule name {name:?}")));
        }
        p.skip_space(true);
        let body = p.alternatives(false)?;
        let lark_name = p.rule(&name);
        if defined.contains(&name) {
            // GBNF adds the alternatives of a rule defined twice.
            if let Some(r) = rules.iter_mut().find(|(n, _)| *n == lark_name) {
                r.1 = format!("{} | {body}", r.1);
            }
        } else {
            defined.push(name);
            rules.push((lark_name, body));
        }
        p.skip_space(false);
        if !p.at_end() && !p.eat_newline() {
            return Err(p.err("expected the end of the line after a rule".into()));
        }
    }
    if !defined.iter().any(|n| n == "root") {
        return Err(GbnfError { line: 1, what: "the grammar has no rule named root".into() });
    }
    if let Some(missing) = p.names.keys().find(|n| !defined.contains(n)) {
        return Err(GbnfError { line: 1, what: format!("rule {missing:?} is used but never defined") });
    }
    let mut out = format!("start: {}\n", p.rule("root"));
    for (name, body) in rules {
        let _ = writeln!(out, "{name}: {body}");
    }
    Ok(out)
}

struct Reader<'a> {
    s: &'a [u8],
    src: &'a str,
    pos: usize,
    /// GBNF rule name -> Lark rule name.
    names: HashMap<String, String>,
}

impl Reader<'_> {
    fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.pos..].starts_with(lit.as_bytes()) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn eat_newline(&mut self) -> bool {
        let start = self.pos;
        while matches!(self.peek(), Some(b'\r' | b'\n')) {
            self.pos += 1;
        }
        self.pos > start
    }

    fn err(&self, what: String) -> GbnfError {
        let line = 1 + self.s[..self.pos.min(self.s.len())].iter().filter(|&&b| b == b'\n').count();
        GbnfError { line, what }
    }

    /// Spaces, tabs and `#` comments; newlines too when `newlines` (inside parentheses, after `|`, and
    /// between rules).
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newlines => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.err("expected a rule name".into()));
        }
        Ok(self.src[start..self.pos].to_owned())
    }

    /// The Lark name of GBNF rule `name`.
    fn rule(&mut self, name: &str) -> String {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let base = format!("r-{}", name.to_ascii_lowercase().replace('_', "-"));
        let mut lark = base.clone();
        let mut k = 1;
        while self.names.values().any(|v| *v == lark) {
            k += 1;
            lark = format!("{base}-{k}");
        }
        self.names.insert(name.to_owned(), lark.clone());
        lark
    }

    /// `seq | seq | ...`; inside parentheses (`nested`) newlines are spaces.
    fn alternatives(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.eat("|") {
            self.skip_space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut items: Vec<String> = Vec::new();
        loop {
            self.skip_space(nested);
            let Some(c) = self.peek() else { break };
            let atom = match c {
                b'"' => self.literal()?,
                b'[' => self.class()?,
                b'.' => {
                    self.pos += 1;
                    "/(?s:.)/".to_owned()
                }
                b'(' => {
                    self.pos += 1;
                    self.skip_space(true);
                    let inner = self.alternatives(true)?;
                    self.skip_space(true);
                    if !self.eat(")") {
                        return Err(self.err("expected ) to close a group".into()));
                    }
                    format!("({inner})")
                }
                b'<' => self.token_ref()?,
                c if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => {
                    let name = self.name()?;
                    self.rule(&name)
                }
                b'*' | b'+' | b'?' | b'{' => {
                    return Err(self.err(format!("{:?} repeats nothing", c as char)));
                }
                _ => break,
            };
            let atom = self.postfix(atom)?;
            items.push(atom);
        }
        Ok(if items.is_empty() { "\"\"".to_owned() } else { items.join(" ") })
    }

    /// `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}` after an atom (several nest, as in GBNF).
    fn postfix(&mut self, mut atom: String) -> Result<String, GbnfError> {
        loop {
            self.skip_space(false);
            match self.peek() {
                Some(c @ (b'*' | b'+' | b'?')) => {
                    self.pos += 1;
                    atom = format!("({atom}){}", c as char);
                }
                Some(b'{') => {
                    self.pos += 1;
                    let min = self.number()?;
                    let range = if self.eat(",") {
                        self.skip_space(false);
                        let max = self.number()?;
                        match (min, max) {
                            (m, Some(n)) => format!("{{{},{n}}}", m.unwrap_or(0)),
                            (m, None) => format!("{{{},}}", m.unwrap_or(0)),
                        }
                    } else {
                        match min {
                            Some(m) => format!("{{{m}}}"),
                            None => return Err(self.err("expected a number in { }".into())),
                        }
                    };
                    self.skip_space(false);
                    if !self.eat("}") {
                        return Err(self.err("expected } to close a repetition".into()));
                    }
                    atom = format!("({atom}){range}");
                }
                _ => return Ok(atom),
            }
        }
    }

    fn number(&mut self) -> Result<Option<u32>, GbnfError> {
        self.skip_space(false);
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.pos == start {
            return Ok(None);
        }
        self.src[start..self.pos].parse().map(Some).map_err(|_| self.err("a repetition count is too large".into()))
    }

    /// `<[123]>` (a token by id) and `<|name|>` style special tokens pass through as Lark has them.
    fn token_ref(&mut self) -> Result<String, GbnfError> {
        let rest = &self.src[self.pos..];
        match rest.find(|c: char| c == '>' || c.is_whitespace()) {
            Some(i) if i > 1 && rest.as_bytes()[i] == b'>' => {
                self.pos += i + 1;
                Ok(rest[..=i].to_owned())
            }
            _ => Err(self.err("expected a token reference such as <[123]> or <|eot_id|>".into())),
        }
    }

    /// One character of a literal or a class, escapes decoded.
    fn char(&mut self, quote: u8) -> Result<char, GbnfError> {
        let rest = &self.src[self.pos..];
        let Some(c) = rest.chars().next() else {
            return Err(self.err(format!("unterminated {}", if quote == b'"' { "string" } else { "class" })));
        };
        self.pos += c.len_utf8();
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.src[self.pos..].chars().next() else {
            return Err(self.err("a backslash ends the grammar".into()));
        };
        self.pos += e.len_utf8();
        let hex = |r: &mut Self, n: usize| -> Result<char, GbnfError> {
            let digits = r.src.get(r.pos..r.pos + n).filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
            let Some(d) = digits else { return Err(r.err(format!("expected {n} hex digits after \\{e}"))) };
            r.pos += n;
            let v = u32::from_str_radix(d, 16).map_err(|_| r.err("bad hex escape".into()))?;
            char::from_u32(v).ok_or_else(|| r.err(format!("\\{e}{d} is not a character")))
        };
        Ok(match e {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' => e,
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            other => return Err(self.err(format!("unknown escape \\{other}"))),
        })
    }

    fn literal(&mut self) -> Result<String, GbnfError> {
        self.pos += 1; // "
        let mut text = String::new();
        loop {
            if self.peek() == Some(b'"') {
                self.pos += 1;
                break;
            }
            if matches!(self.peek(), Some(b'\n') | None) {
                return Err(self.err("unterminated string".into()));
            }
            text.push(self.char(b'"')?);
        }
        Ok(lark_string(&text))
    }

    fn class(&mut self) -> Result<String, GbnfError> {
        self.pos += 1; // [
        let mut out = String::from("/[");
        if self.peek() == Some(b'^') {
            self.pos += 1;
            out.push('^');
        }
        let mut any = false;
        loop {
            match self.peek() {
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                None | Some(b'\n') => return Err(self.err("unterminated character class".into())),
                _ => {}
            }
            let lo = self.char(b'[')?;
            let _ = write!(out, "\\x{{{:x}}}", lo as u32);
            if self.peek() == Some(b'-') && !matches!(self.s.get(self.pos + 1), Some(b']' | b'\n') | None) {
                self.pos += 1;
                let hi = self.char(b'[')?;
                if hi < lo {
                    return Err(self.err(format!("the range {lo:?}-{hi:?} is empty")));
                }
                let _ = write!(out, "-\\x{{{:x}}}", hi as u32);
            }
            any = true;
        }
        if !any {
            return Err(self.err("an empty character class matches nothing".into()));
        }
        out.push_str("]/");
        Ok(out)
    }
}

/// `text` as a Lark string literal: JSON escapes, and every control character (DEL too) as `\uXXXX`.
pub fn lark_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_literals_classes_and_repeats_translate() {
        let lark = to_lark(
            "root ::= \"a\\n\" item* ( \"x\" | [0-9a-f] ){2,3} # comment\n\
             item ::= [^\"\\\\] | .\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: r-root\n\
             r-root: \"a\\u000a\" (r-item)* ((\"x\" | /[\\x{30}-\\x{39}\\x{61}-\\x{66}]/)){2,3}\n\
             r-item: /[^\\x{22}\\x{5c}]/ | /(?s:.)/\n"
        );
    }

    #[test]
    fn alternatives_continue_after_a_bar_that_ends_a_line() {
        let lark = to_lark("root ::= a |\n  b\na ::= \"A\"\nb ::= \"B\"").unwrap();
        assert_eq!(lark, "start: r-root\nr-root: r-a | r-b\nr-a: \"A\"\nr-b: \"B\"\n");
    }

    #[test]
    fn names_differing_in_case_stay_apart() {
        let lark = to_lark("root ::= Item item\nItem ::= \"A\"\nitem ::= \"a\"\n").unwrap();
        assert!(lark.contains("r-item: \"A\"") && lark.contains("r-item-2: \"a\""), "{lark}");
    }

    #[test]
    fn mistakes_name_their_line() {
        let e = to_lark("root ::= item\n").unwrap_err();
        assert!(e.what.contains("\"item\" is used but never defined"), "{e}");
        let e = to_lark("root ::= \"a\"\nx ::= [a-\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(to_lark("item ::= \"a\"").unwrap_err().what.contains("no rule named root"));
        assert!(to_lark("root := \"a\"").unwrap_err().what.contains("expected ::="));
        assert!(to_lark("root ::= \"a").unwrap_err().what.contains("unterminated string"));
        assert!(to_lark("root ::= [z-a]").unwrap_err().what.contains("empty"));
        assert!(to_lark("root ::= * \"a\"").unwrap_err().what.contains("repeats nothing"));
    }

    #[test]
    fn lark_strings_escape_what_json_escapes_and_del() {
        assert_eq!(lark_string("a\"b\\c\t\u{7f}é"), "\"a\\\"b\\\\c\\u0009\\u007fé\"");
    }
}
