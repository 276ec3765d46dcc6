//! The loss curve as an SVG picture: people would rather look at it than read numbers.

use std::fmt::Write;

/// A line plot of `loss` against step, with the axes' ranges labelled.
pub fn loss_curve(title: &str, steps: &[u64], loss: &[f64]) -> String {
    let (w, h, pad) = (640.0, 360.0, 50.0);
    let (x0, x1) = (
        *steps.first().unwrap_or(&0) as f64,
        *steps.last().unwrap_or(&1) as f64,
    );
    let finite = loss.iter().copied().filter(|l| l.is_finite());
    let lo = finite.clone().fold(f64::INFINITY, f64::min).min(0.0);
    let hi = finite.fold(f64::NEG_INFINITY, f64::max).max(lo + 1e-9);
    let px = |s: f64| pad + (s - x0) / (x1 - x0).max(1.0) * (w - 2.0 * pad);
    let py = |l: f64| h - pad - (l - lo) / (hi - lo) * (h - 2.0 * pad);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="20" text-anchor="middle" font-size="14">{title}</text>
<line x1="{pad}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{}" stroke="black"/>
<text x="{pad}" y="{}" text-anchor="middle">{x0}</text>
<text x="{}" y="{}" text-anchor="middle">{x1}</text>
<text x="{}" y="{}" text-anchor="middle">step</text>
<text x="{}" y="{}" text-anchor="end">{hi:.2}</text>
<text x="{}" y="{}" text-anchor="end">{lo:.2}</text>
<text x="15" y="{}" transform="rotate(-90 15 {})" text-anchor="middle">loss</text>
<polyline fill="none" stroke="steelblue" stroke-width="1.5" points=""#,
        w / 2.0,
        h - pad,
        w - pad,
        h - pad,
        h - pad,
        h - pad + 16.0,
        w - pad,
        h - pad + 16.0,
        w / 2.0,
        h - pad + 32.0,
        pad - 4.0,
        pad + 4.0,
        pad - 4.0,
        h - pad + 4.0,
        h / 2.0,
        h / 2.0,
    );
    for (&s, &l) in steps.iter().zip(loss).filter(|(_, l)| l.is_finite()) {
        let _ = write!(svg, "{:.1},{:.1} ", px(s as f64), py(l));
    }
    svg.push_str("\"/>\n</svg>\n");
    svg
}
