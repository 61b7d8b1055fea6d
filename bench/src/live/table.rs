//! A small text table rendered as GitHub markdown (numbers right-aligned).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; short rows are padded with empty cells.
    pub fn push(&mut self, mut row: Vec<String>) {
        row.resize(self.headers.len().max(row.len()), String::new());
        self.rows.push(row);
    }

    /// Markdown; the first column left-aligned, the rest right-aligned.
    pub fn to_markdown(&self) -> String {
        let cols = self.headers.len();
        let mut out = String::new();
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for c in cells.iter().take(cols) {
                s.push(' ');
                s.push_str(&c.replace('|', "\\|"));
                s.push_str(" |");
            }
            s.push('\n');
            s
        };
        out.push_str(&line(&self.headers));
        out.push('|');
        for i in 0..cols {
            out.push_str(if i == 0 { "---|" } else { "---:|" });
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// `v` with `digits` decimals, or `–` when absent.
pub fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "–".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_markdown() {
        let mut t = Table::new(&["a", "b"]);
        t.push(vec!["x|y".into(), num(Some(1.234), 2)]);
        t.push(vec!["z".into()]);
        assert_eq!(
            t.to_markdown(),
            "| a | b |\n|---|---:|\n| x\\|y | 1.23 |\n| z |  |\n"
        );
        assert_eq!(num(None, 1), "–");
    }
}
