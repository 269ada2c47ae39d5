//! The results: percentiles, number formats, the rows of the table and how they render
//! for a terminal and as Markdown for docs/benchmarks.md.

use std::time::Duration;

use super::machine::Machine;
use super::meters::Cpu;
use super::units::fmt_duration;

/// The value at percentile `p` (0 < p ≤ 100) of ascending `sorted`, by nearest rank.
pub(super) fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50, p99 and max of some latencies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Summary {
    pub(super) p50: Duration,
    pub(super) p99: Duration,
    pub(super) max: Duration,
}

pub(super) fn summarize(latencies: &[Duration]) -> Option<Summary> {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    Some(Summary { p50: percentile(&sorted, 50.0)?, p99: percentile(&sorted, 99.0)?, max: *sorted.last()? })
}

/// One line of the results table.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Row {
    pub(super) measurement: String,
    pub(super) result: String,
    pub(super) latency: Option<Summary>,
    pub(super) cpu: Option<Cpu>,
    pub(super) aim: String,
}

impl Row {
    pub(super) fn new(
        measurement: impl Into<String>,
        result: impl Into<String>,
        latencies: Option<&[Duration]>,
        aim: impl Into<String>,
    ) -> Row {
        Row {
            measurement: measurement.into(),
            result: result.into(),
            latency: latencies.and_then(summarize),
            cpu: None,
            aim: aim.into(),
        }
    }

    pub(super) fn with_cpu(mut self, cpu: Option<Cpu>) -> Row {
        self.cpu = cpu;
        self
    }

    pub(super) fn cells(&self) -> [String; COLUMNS] {
        let lat = |f: fn(&Summary) -> Duration| {
            self.latency.as_ref().map(|s| fmt_duration(f(s))).unwrap_or_default()
        };
        [
            self.measurement.clone(),
            self.result.clone(),
            lat(|s| s.p50),
            lat(|s| s.p99),
            lat(|s| s.max),
            self.cpu.map(|c| c.to_string()).unwrap_or_default(),
            self.aim.clone(),
        ]
    }
}

pub(super) const COLUMNS: usize = 7;
pub(super) const HEADER: [&str; COLUMNS] =
    ["measurement", "result", "p50", "p99", "max", "CPU daemon/bench", "aim"];

/// The table for a terminal: columns padded to their widest cell.
pub(super) fn render_text(rows: &[Row]) -> String {
    let cells: Vec<[String; COLUMNS]> =
        std::iter::once(HEADER.map(String::from)).chain(rows.iter().map(Row::cells)).collect();
    let mut widths = [0; COLUMNS];
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &cells {
        let padded: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out += padded.join("  ").trim_end();
        out.push('\n');
    }
    out
}

/// The table as Markdown.
pub(super) fn render_markdown_table(rows: &[Row]) -> String {
    let mut out = format!("| {} |\n|{}\n", HEADER.join(" | "), "---|".repeat(HEADER.len()));
    for row in rows {
        out += &format!("| {} |\n", row.cells().map(|c| c.replace('|', "\\|")).join(" | "));
    }
    out
}

/// A section for docs/benchmarks.md: when, where, with which flags, and the table.
pub(super) fn render_markdown(m: &Machine, load_after: &str, flags: &str, rows: &[Row]) -> String {
    format!(
        "### Run of {date}\n\n\
         - machine: {cpus} × {cpu}, {mem}, Linux {kernel}\n\
         - load average (1/5/15 min): {load_before} before, {load_after} after\n\
         - `hive bench {flags}`\n\n\
         {table}",
        date = m.date,
        cpus = m.cpus,
        cpu = m.cpu,
        mem = m.memory,
        kernel = m.kernel,
        load_before = m.load,
        load_after = load_after,
        flags = flags,
        table = render_markdown_table(rows),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&sorted, 50.0), Some(ms(50)));
        assert_eq!(percentile(&sorted, 99.0), Some(ms(99)));
        assert_eq!(percentile(&sorted, 100.0), Some(ms(100)));
        assert_eq!(percentile(&[ms(7)], 99.0), Some(ms(7)));
        assert_eq!(percentile(&[ms(1), ms(2)], 50.0), Some(ms(1)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn summaries_sort_first() {
        let s = summarize(&[ms(3), ms(1), ms(2)]).unwrap();
        assert_eq!(s, Summary { p50: ms(2), p99: ms(3), max: ms(3) });
        assert_eq!(summarize(&[]), None);
    }

    #[test]
    fn tables_render_for_terminals_and_markdown() {
        let rows = vec![
            Row::new("creates", "10/s", Some(&[ms(1), ms(3)][..]), "≥ 5/s: met").with_cpu(Some(Cpu {
                daemon: 1.0,
                bench: 0.25,
                steal: None,
            })),
            Row::new("memory", "VmRSS 1 MiB", None, ""),
        ];
        let text = render_text(&rows);
        assert_eq!(
            text,
            "measurement  result       p50      p99      max      CPU daemon/bench  aim\n\
             creates      10/s         1.00 ms  3.00 ms  3.00 ms  100% / 25%        ≥ 5/s: met\n\
             memory       VmRSS 1 MiB\n"
        );
        let markdown = render_markdown_table(&rows);
        assert_eq!(
            markdown,
            "| measurement | result | p50 | p99 | max | CPU daemon/bench | aim |\n\
             |---|---|---|---|---|---|---|\n\
             | creates | 10/s | 1.00 ms | 3.00 ms | 3.00 ms | 100% / 25% | ≥ 5/s: met |\n\
             | memory | VmRSS 1 MiB |  |  |  |  |  |\n"
        );
    }
}
