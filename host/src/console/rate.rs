//! Deliveries per second over the last hour, for the overview's sparkline.
//!
//! Owns: a ring of [`SAMPLES`] one-minute samples of the daemon's own
//! delivered counter (`Metrics::delivered_total`), taken every
//! [`SAMPLE_EVERY`] by one task, and the inline SVGs drawn from figures
//! (this sparkline, and a destination's delivered/failed per minute).
//!
//! Must never: touch the store, or draw anything but numbers it computed
//! (the SVG is built from figures only, so it needs no escaping).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::metrics::Metrics;

/// How often the delivered counter is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(60);
/// Samples kept: an hour of minutes.
pub const SAMPLES: usize = 60;

/// The last hour of delivery rates.
#[derive(Debug, Default)]
pub struct Rate {
    /// Deliveries per second over each minute, oldest first.
    per_second: Mutex<VecDeque<f64>>,
}

impl Rate {
    /// Sample `metrics` every [`SAMPLE_EVERY`] until `stop` turns true.
    pub fn run(
        self: Arc<Self>,
        metrics: Arc<Metrics>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut last = metrics.delivered_total.load(Ordering::Relaxed);
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => return,
                }
                let now = metrics.delivered_total.load(Ordering::Relaxed);
                self.push(now.saturating_sub(last) as f64 / SAMPLE_EVERY.as_secs_f64());
                last = now;
            }
        })
    }

    fn push(&self, per_second: f64) {
        let mut ring = self.per_second.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() == SAMPLES {
            ring.pop_front();
        }
        ring.push_back(per_second);
    }

    /// The samples, oldest first.
    pub fn samples(&self) -> Vec<f64> {
        self.per_second
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect()
    }
}

/// An inline SVG sparkline of `samples` (oldest left), `width` × `height`
/// pixels, scaled to the largest sample; `None` with fewer than two.
pub fn sparkline(samples: &[f64], width: u32, height: u32) -> Option<String> {
    if samples.len() < 2 {
        return None;
    }
    let max = samples.iter().copied().fold(0.0_f64, f64::max).max(1e-9);
    let step = f64::from(width) / (samples.len() - 1) as f64;
    let h = f64::from(height);
    let points: Vec<String> = samples
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let y = h - 1.0 - (v / max) * (h - 2.0);
            format!("{:.1},{:.1}", i as f64 * step, y)
        })
        .collect();
    Some(format!(
        "<svg class=\"spark\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" \
         role=\"img\" aria-label=\"deliveries per second, last hour\">\
         <polyline fill=\"none\" stroke=\"currentColor\" stroke-width=\"1.5\" points=\"{}\"/></svg>",
        points.join(" ")
    ))
}

/// The points of `samples` on a `width` × `height` box scaled to `max`.
fn points(samples: &[f64], max: f64, width: u32, height: u32) -> String {
    let step = f64::from(width) / (samples.len().max(2) - 1) as f64;
    let h = f64::from(height);
    samples
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                "{:.1},{:.1}",
                i as f64 * step,
                h - 1.0 - (v / max) * (h - 2.0)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// An inline SVG of two series on one scale — `delivered` (class `ok`)
/// and `failed` (class `bad`), oldest left — with a title giving their
/// sums; `None` with fewer than two samples.
pub fn sparkline_pair(
    delivered: &[f64],
    failed: &[f64],
    width: u32,
    height: u32,
) -> Option<String> {
    if delivered.len() < 2 || failed.len() != delivered.len() {
        return None;
    }
    let max = delivered
        .iter()
        .chain(failed)
        .copied()
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let (d, f): (f64, f64) = (delivered.iter().sum(), failed.iter().sum());
    Some(format!(
        "<svg class=\"spark pair\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" \
         role=\"img\" aria-label=\"events per minute, last hour: {d:.0} delivered, {f:.0} failed\">\
         <title>last hour: {d:.0} delivered, {f:.0} failed</title>\
         <polyline class=\"ok\" fill=\"none\" stroke=\"currentColor\" stroke-width=\"1.5\" points=\"{}\"/>\
         <polyline class=\"bad\" fill=\"none\" stroke=\"currentColor\" stroke-width=\"1.5\" points=\"{}\"/></svg>",
        points(delivered, max, width, height),
        points(failed, max, width, height),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_an_hour_and_the_line_spans_the_width() {
        let r = Rate::default();
        for i in 0..(SAMPLES + 5) {
            r.push(i as f64);
        }
        let s = r.samples();
        assert_eq!(s.len(), SAMPLES);
        assert_eq!(s[0], 5.0);
        assert!(sparkline(&s[..1], 100, 20).is_none());
        let svg = sparkline(&[0.0, 2.0, 1.0], 100, 20).unwrap();
        assert!(svg.contains("0.0,19.0 50.0,1.0 100.0,10.0"), "{svg}");
        let pair = sparkline_pair(&[2.0, 0.0], &[0.0, 2.0], 100, 20).unwrap();
        assert!(pair.contains("2 delivered, 2 failed"), "{pair}");
        assert!(pair.contains("class=\"bad\" fill=\"none\" stroke=\"currentColor\" stroke-width=\"1.5\" points=\"0.0,19.0 100.0,1.0\""), "{pair}");
    }
}
