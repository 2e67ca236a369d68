//! Reading Prometheus text exposition from a process's `/metrics` on 127.0.0.1.

/// The body of `GET /metrics` on 127.0.0.1:`port`.
pub async fn scrape(port: u16) -> Option<String> {
    let response = super::process::http_get(port, "/metrics").await?;
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}

/// The samples of metric `name`: `(labels text between the braces, value)`.
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(move |l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
                r.rsplit_once("} ")?
            } else {
                ("", rest.strip_prefix(' ')?)
            };
            Some((labels, value.trim().parse().ok()?))
        })
}

/// The value of metric `name`, summed over its label sets; `None` without a sample.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = samples(text, name).map(|(_, v)| v).collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The sum of the samples of `name` whose labels contain the text `label`
/// (e.g. `controller="machine"`); 0 when none does.
pub fn metric_with(text: &str, name: &str, label: &str) -> f64 {
    samples(text, name)
        .filter(|(labels, _)| labels.contains(label))
        .map(|(_, v)| v)
        .sum()
}

/// The sum of the samples of `name` that carry every `key="value"` of `labels`; `None`
/// without such a sample.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let values: Vec<f64> = samples(text, name)
        .filter(|(have, _)| {
            let have: Vec<&str> = have.split(',').collect();
            wanted.iter().all(|w| have.contains(&w.as_str()))
        })
        .map(|(_, v)| v)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x_total X\n# TYPE x_total counter\n\
        x_total{controller=\"machine\",code=\"ok\"} 3\n\
        x_total{controller=\"machineset\",code=\"ok\"} 4\n\
        x_total_extra 100\n\
        plain 2.5\n";

    #[test]
    fn samples_are_read_by_name_and_labels() {
        assert_eq!(metric(TEXT, "x_total"), Some(7.0));
        assert_eq!(metric(TEXT, "plain"), Some(2.5));
        assert_eq!(metric(TEXT, "absent"), None);
        assert_eq!(metric_with(TEXT, "x_total", "controller=\"machine\""), 3.0);
        assert_eq!(
            sample(TEXT, "x_total", &[("controller", "machineset")]),
            Some(4.0)
        );
        assert_eq!(sample(TEXT, "x_total", &[("code", "ok")]), Some(7.0));
        assert_eq!(sample(TEXT, "x_total", &[("code", "err")]), None);
    }
}
