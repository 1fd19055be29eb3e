//! `/metrics`: Prometheus text with vLLM's metric names under the `ruda:` prefix.

use std::fmt::Write;

use ruda_llm::EngineMetrics;

/// Render `m` for the model `model_name`.
pub fn render(m: &EngineMetrics, model_name: &str) -> String {
    let label = format!("model_name=\"{}\"", escape(model_name));
    let mut out = String::new();
    let s = &m.scheduler;
    let gauges: [(&str, &str, f64); 3] = [
        ("ruda:num_requests_running", "Number of requests in model execution batches.", s.running as f64),
        ("ruda:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting as f64),
        ("ruda:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{label}}} {}", number(value));
    }
    let counters: [(&str, &str, u64); 5] = [
        (
            "ruda:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_queries,
        ),
        ("ruda:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits),
        ("ruda:num_preemptions_total", "Cumulative number of preemptions from the engine.", s.preemptions),
        ("ruda:prompt_tokens_total", "Number of prefill tokens processed.", s.prompt_tokens),
        ("ruda:generation_tokens_total", "Number of generation tokens processed.", s.generation_tokens),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{label}}} {value}");
    }
    let histograms = [
        ("ruda:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &m.time_to_first_token),
        ("ruda:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &m.inter_token_latency),
        ("ruda:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &m.e2e_request_latency),
    ];
    for (name, help, h) in histograms {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in h.buckets.iter().zip(&h.counts) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{{label},le=\"{}\"}} {cumulative}", number(*bound));
        }
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "{name}_sum{{{label}}} {}", number(h.sum));
        let _ = writeln!(out, "{name}_count{{{label}}} {}", h.count);
    }
    out
}

/// Prometheus' number format (`1.0`, not `1`, as Python's client writes bounds).
fn number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn histograms_are_cumulative_and_end_in_inf() {
        let mut m = ruda_llm::EngineMetrics::default();
        m.time_to_first_token.counts[0] = 2;
        m.time_to_first_token.counts[2] = 1;
        m.time_to_first_token.count = 4;
        m.time_to_first_token.sum = 100.5;
        let text = super::render(&m, "tiny");
        assert!(text.contains("ruda:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.001\"} 2\n"));
        assert!(text.contains("ruda:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.01\"} 3\n"));
        assert!(text.contains("ruda:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} 4\n"));
        assert!(text.contains("ruda:time_to_first_token_seconds_sum{model_name=\"tiny\"} 100.5\n"));
        assert!(text
            .contains("# TYPE ruda:num_requests_running gauge\nruda:num_requests_running{model_name=\"tiny\"} 0.0\n"));
    }
}
