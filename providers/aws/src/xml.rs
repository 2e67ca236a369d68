//! EC2's Query protocol, the response side: XML documents read into a small tree of elements
//! (names without namespace prefixes, text with entities resolved, attributes ignored: EC2's
//! responses carry everything in elements).

/// An XML element: its local name, its text and its child elements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Element {
    /// The local name (`instancesSet`, ...).
    pub name: String,
    /// The text directly inside it, entities resolved (empty for elements with children).
    pub text: String,
    /// The child elements in document order.
    pub children: Vec<Element>,
}

/// The document is not well-formed XML.
#[derive(Debug, thiserror::Error)]
pub enum XmlError {
    /// The tokenizer refused it.
    #[error("malformed XML: {0}")]
    Syntax(#[from] xmlparser::Error),
    /// An end tag does not close the open element, or elements are left open.
    #[error("malformed XML: {0}")]
    Structure(String),
    /// An entity or character reference that is not XML's.
    #[error("malformed XML: unknown entity &{0};")]
    Entity(String),
}

impl Element {
    /// The first child named `name`.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// The children named `name`.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The text of the first child named `name`, if it has that child.
    pub fn text_of(&self, name: &str) -> Option<&str> {
        self.child(name).map(|c| c.text.as_str())
    }

    /// The `<item>`s of the list child `name` (EC2's lists: `<name><item>…</item></name>`).
    pub fn items<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Element> {
        self.child(name)
            .into_iter()
            .flat_map(|list| list.children_named("item"))
    }

    /// The element at `path` of child names.
    pub fn at(&self, path: &[&str]) -> Option<&Element> {
        path.iter().try_fold(self, |e, name| e.child(name))
    }
}

/// Reads a document into its root element.
pub fn parse(text: &str) -> Result<Element, XmlError> {
    let mut stack: Vec<Element> = Vec::new();
    let mut root = None;
    for token in xmlparser::Tokenizer::from(text) {
        match token? {
            xmlparser::Token::ElementStart { local, .. } => stack.push(Element {
                name: local.as_str().to_string(),
                ..Element::default()
            }),
            xmlparser::Token::ElementEnd { end, .. } => {
                let closes = match end {
                    xmlparser::ElementEnd::Open => continue,
                    xmlparser::ElementEnd::Empty => None,
                    xmlparser::ElementEnd::Close(_, local) => Some(local.as_str()),
                };
                let done = stack
                    .pop()
                    .ok_or_else(|| XmlError::Structure("an end tag without a start".into()))?;
                if let Some(name) = closes
                    && name != done.name
                {
                    return Err(XmlError::Structure(format!(
                        "</{name}> closes <{}>",
                        done.name
                    )));
                }
                match stack.last_mut() {
                    Some(parent) => parent.children.push(done),
                    None => root = Some(done),
                }
            }
            xmlparser::Token::Text { text } => {
                if let Some(e) = stack.last_mut() {
                    e.text.push_str(&unescape(text.as_str())?);
                }
            }
            xmlparser::Token::Cdata { text, .. } => {
                if let Some(e) = stack.last_mut() {
                    e.text.push_str(text.as_str());
                }
            }
            _ => {}
        }
    }
    if !stack.is_empty() {
        return Err(XmlError::Structure(format!(
            "<{}> is not closed",
            stack[stack.len() - 1].name
        )));
    }
    let mut root = root.ok_or_else(|| XmlError::Structure("no root element".into()))?;
    trim_containers(&mut root);
    Ok(root)
}

/// Drops the whitespace between child elements from their parent's text.
fn trim_containers(e: &mut Element) {
    if !e.children.is_empty() {
        if e.text.trim().is_empty() {
            e.text.clear();
        }
        e.children.iter_mut().for_each(trim_containers);
    }
}

/// Resolves XML's five entities and character references.
fn unescape(s: &str) -> Result<String, XmlError> {
    if !s.contains('&') {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let end = after
            .find(';')
            .ok_or_else(|| XmlError::Entity(after.chars().take(8).collect()))?;
        let entity = &after[..end];
        let c = match entity {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) = entity.strip_prefix("#x") {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(dec) = entity.strip_prefix('#') {
                    dec.parse().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| XmlError::Entity(entity.to_string()))?
            }
        };
        out.push(c);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_become_trees_with_text_resolved() {
        let doc = parse(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
    <requestId>r-1</requestId>
    <reservationSet>
        <item><instancesSet><item><instanceId>i-1</instanceId><tagSet>
            <item><key>Name</key><value>a &amp; b &#x41;&#66;</value></item>
        </tagSet><empty/></item></instancesSet></item>
    </reservationSet>
    <nextToken/>
</DescribeInstancesResponse>"#,
        )
        .unwrap();
        assert_eq!(doc.name, "DescribeInstancesResponse");
        assert_eq!(doc.text, "");
        assert_eq!(doc.text_of("requestId"), Some("r-1"));
        assert_eq!(doc.text_of("nextToken"), Some(""));
        let instance = doc
            .items("reservationSet")
            .flat_map(|r| r.items("instancesSet"))
            .next()
            .unwrap();
        assert_eq!(instance.text_of("instanceId"), Some("i-1"));
        let tag = instance.items("tagSet").next().unwrap();
        assert_eq!(tag.text_of("value"), Some("a & b AB"));
        assert_eq!(instance.text_of("empty"), Some(""));
        assert_eq!(
            doc.at(&["reservationSet", "item", "instancesSet"])
                .map(|e| e.children.len()),
            Some(1)
        );
    }

    #[test]
    fn malformed_documents_are_errors() {
        for bad in [
            "<a><b></a>",
            "<a>",
            "",
            "<a>&nope;</a>",
            "<a>&amp</a>",
            "<a></b>",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }
}
