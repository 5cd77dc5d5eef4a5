//! Text from outside the agent (container names and ids, addresses, kernel reasons, the host
//! name) as the page writes it. maud escapes `&`, `<`, `>` and `"` in every string it splices;
//! [`Text`] escapes `'` as well, as the page always has, so such a string stays inert in any
//! HTML context, single-quoted attributes included.

use maud::Render;

/// A string from outside, spliced into the page.
pub struct Text<'a>(pub &'a str);

impl Render for Text<'_> {
    fn render_to(&self, out: &mut String) {
        for c in self.0.chars() {
            match c {
                '&' => out.push_str("&amp;"),
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                '"' => out.push_str("&quot;"),
                '\'' => out.push_str("&#39;"),
                c => out.push(c),
            }
        }
    }
}

/// `s` as the page writes text from outside (what to look for in the page).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    Text(s).render_to(&mut out);
    out
}
