//! Performance budgets: every registered configuration, as the op entry points launch it (after
//! the default passes), runs its sample problem in the interpreter with counters on
//! (`ruda_ir::interp::run_profiled`), and the rules of `ops/budgets.txt` must hold. A rule is
//! keyed by configuration (a pattern) and by op class, never by source location, which moves
//! with every edit; a failure names the configuration and the sites that broke the rule.
//!
//! `RUDA_BUDGETS_REPORT=FILE` writes every configuration's figures (one line per
//! configuration and class) for choosing new bounds.

use std::fmt::Write as _;

use ruda_ir::interp::{run_profiled, Counters, Profile, SiteCounters};
use ruda_ops::registry::registry;
use ruda_ops::sample::Sampler;

const BUDGETS: &str = include_str!("../budgets.txt");

/// The sites a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Every shared-memory load and store (`ldmatrix` and the shared half of `cp.async` too).
    Shared,
    Ldmatrix,
    /// Global loads (`cp.async`'s global half included).
    GlobalLoad,
    GlobalStore,
}

impl Class {
    fn parse(s: &str) -> Option<Class> {
        Some(match s {
            "shared" => Class::Shared,
            "ldmatrix" => Class::Ldmatrix,
            "global_load" => Class::GlobalLoad,
            "global_store" => Class::GlobalStore,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Class::Shared => "shared",
            Class::Ldmatrix => "ldmatrix",
            Class::GlobalLoad => "global_load",
            Class::GlobalStore => "global_store",
        }
    }

    fn holds(self, site: &SiteCounters) -> bool {
        let c = &site.counters;
        match self {
            Class::Shared => c.shared_load_requests + c.shared_store_requests > 0,
            Class::Ldmatrix => site.op.starts_with("ldmatrix"),
            Class::GlobalLoad => c.global_load_requests > 0,
            Class::GlobalStore => c.global_store_requests > 0,
        }
    }

    /// Bank conflicts of a site in this class.
    fn conflicts(self, c: &Counters) -> u64 {
        c.shared_bank_conflicts()
    }

    /// (bytes the lanes asked for, bytes moved in 32-byte sectors) of a site in this class.
    fn traffic(self, c: &Counters) -> (u64, u64) {
        match self {
            Class::GlobalLoad => (c.global_load_bytes_requested, 32 * c.global_load_sectors),
            Class::GlobalStore => (c.global_store_bytes_requested, 32 * c.global_store_sectors),
            Class::Shared | Class::Ldmatrix => (0, 0),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Metric {
    /// The class's bank conflicts, summed over its sites, are at most this.
    Conflicts(u64),
    /// The class's bytes requested over bytes moved, summed over its sites, are at least this
    /// (above 1 where lanes share sectors, e.g. a broadcast).
    Efficiency(f64),
    /// Every site of the class on its own reaches this efficiency.
    SiteEfficiency(f64),
}

impl Metric {
    fn kind(self) -> &'static str {
        match self {
            Metric::Conflicts(_) => "conflicts",
            Metric::Efficiency(_) => "efficiency",
            Metric::SiteEfficiency(_) => "site_efficiency",
        }
    }
}

struct Rule {
    line: usize,
    pattern: String,
    class: Class,
    metric: Metric,
}

fn parse_rules(text: &str) -> Result<Vec<Rule>, String> {
    let mut rules = vec![];
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split(" -- ").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let bad = |why: &str| format!("budgets.txt:{}: {why}: `{raw}`", i + 1);
        let [pattern, class, metric, bound] = words[..] else {
            return Err(bad("expected PATTERN CLASS METRIC BOUND [-- why]"));
        };
        let class = Class::parse(class).ok_or_else(|| bad("unknown class"))?;
        let number = || bound.parse::<f64>().ok().filter(|b| b.is_finite() && *b >= 0.0);
        let metric = match metric {
            "conflicts" => Metric::Conflicts(bound.parse().map_err(|_| bad("a conflict bound is a count"))?),
            "efficiency" => Metric::Efficiency(number().ok_or_else(|| bad("an efficiency is a number"))?),
            "site_efficiency" => Metric::SiteEfficiency(number().ok_or_else(|| bad("an efficiency is a number"))?),
            _ => return Err(bad("unknown metric")),
        };
        if matches!(metric, Metric::Conflicts(_)) != matches!(class, Class::Shared | Class::Ldmatrix) {
            return Err(bad("conflicts apply to shared and ldmatrix, efficiencies to global classes"));
        }
        rules.push(Rule { line: i + 1, pattern: pattern.to_string(), class, metric });
    }
    Ok(rules)
}

/// `*` matches any run of characters; everything else matches itself.
fn matches(pattern: &str, id: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == id,
        Some((head, rest)) => {
            id.starts_with(head) && (0..=id.len() - head.len()).any(|i| matches(rest, &id[head.len() + i..]))
        }
    }
}

/// The rules that apply to `id`: for each class and metric kind, the last matching line.
fn rules_for<'r>(rules: &'r [Rule], id: &str) -> Vec<&'r Rule> {
    let mut chosen: Vec<&Rule> = vec![];
    for r in rules.iter().filter(|r| matches(&r.pattern, id)) {
        chosen.retain(|c| (c.class, c.metric.kind()) != (r.class, r.metric.kind()));
        chosen.push(r);
    }
    chosen
}

fn site_name(s: &SiteCounters) -> String {
    let loc = s.loc.as_ref().map_or("?".to_string(), |l| l.to_string());
    format!("`{}` (instruction {}) at {loc}", s.op, s.inst.index())
}

/// Why `rule` fails on `profile`, if it does.
fn check(rule: &Rule, id: &str, profile: &Profile) -> Option<String> {
    let sites: Vec<&SiteCounters> = profile.sites.iter().filter(|s| rule.class.holds(s)).collect();
    let class = rule.class.name();
    let head = format!("`{id}`: budgets.txt:{}: {class}", rule.line);
    match rule.metric {
        Metric::Conflicts(max) => {
            let total: u64 = sites.iter().map(|s| rule.class.conflicts(&s.counters)).sum();
            (total > max).then(|| {
                let mut m = format!("{head} has {total} bank conflicts, the budget is {max}; sites:");
                for s in sites.iter().filter(|s| rule.class.conflicts(&s.counters) > 0) {
                    let _ = write!(m, "\n    {} conflicts: {}", rule.class.conflicts(&s.counters), site_name(s));
                }
                m
            })
        }
        Metric::Efficiency(min) => {
            let (asked, moved) = sites.iter().fold((0, 0), |(a, m), s| {
                let (x, y) = rule.class.traffic(&s.counters);
                (a + x, m + y)
            });
            let eff = if moved == 0 { f64::INFINITY } else { asked as f64 / moved as f64 };
            (eff < min).then(|| {
                let worst = sites.iter().min_by(|a, b| site_eff(rule.class, a).total_cmp(&site_eff(rule.class, b)));
                format!(
                    "{head} efficiency {eff:.3} (bytes requested / bytes moved) is below {min}; the worst site: {}",
                    worst.map_or("none".to_string(), |s| format!("{:.3}, {}", site_eff(rule.class, s), site_name(s)))
                )
            })
        }
        Metric::SiteEfficiency(min) => {
            let low: Vec<String> = sites
                .iter()
                .filter(|s| site_eff(rule.class, s) < min)
                .map(|s| format!("\n    {:.3}: {}", site_eff(rule.class, s), site_name(s)))
                .collect();
            (!low.is_empty()).then(|| format!("{head} sites below efficiency {min}:{}", low.concat()))
        }
    }
}

fn site_eff(class: Class, s: &SiteCounters) -> f64 {
    let (asked, moved) = class.traffic(&s.counters);
    if moved == 0 {
        f64::INFINITY
    } else {
        asked as f64 / moved as f64
    }
}

#[test]
fn every_registered_configuration_meets_its_budgets() {
    let rules = parse_rules(BUDGETS).unwrap_or_else(|e| panic!("{e}"));
    let mut sampler = Sampler::default();
    let mut failures = vec![];
    let mut report = String::new();
    let mut checked = 0;
    for r in registry() {
        let mut kernel = r.build().unwrap_or_else(|e| panic!("`{}` does not verify: {e}", r.id));
        let problem = sampler.problem(Some((r.family, &r.id)), &kernel, 0).unwrap_or_else(|e| panic!("{e}"));
        ruda_ir::passes::optimize(&mut kernel).unwrap_or_else(|e| panic!("`{}`: {e}", r.id));
        let mut profile = None;
        problem
            .run_with(|a| {
                profile = Some(run_profiled(&kernel, &problem.launch, a, 1)?);
                Ok::<_, ruda_ir::interp::InterpError>(())
            })
            .unwrap_or_else(|e| panic!("`{}`: the interpreter failed: {e}", r.id));
        let profile = profile.expect("run_profiled returned");
        for class in [Class::Shared, Class::Ldmatrix, Class::GlobalLoad, Class::GlobalStore] {
            let sites: Vec<&SiteCounters> = profile.sites.iter().filter(|s| class.holds(s)).collect();
            let conflicts: u64 = sites.iter().map(|s| class.conflicts(&s.counters)).sum();
            let (asked, moved) = sites.iter().fold((0, 0), |(a, m), s| {
                let (x, y) = class.traffic(&s.counters);
                (a + x, m + y)
            });
            let min_site = sites.iter().map(|s| site_eff(class, s)).fold(f64::INFINITY, f64::min);
            let _ = writeln!(
                report,
                "{} {} sites={} conflicts={conflicts} efficiency={:.4} min_site_efficiency={min_site:.4}",
                r.id,
                class.name(),
                sites.len(),
                if moved == 0 { f64::INFINITY } else { asked as f64 / moved as f64 }
            );
        }
        for rule in rules_for(&rules, &r.id) {
            checked += 1;
            if let Some(f) = check(rule, &r.id, &profile) {
                failures.push(f);
            }
        }
    }
    if let Some(path) = std::env::var_os("RUDA_BUDGETS_REPORT") {
        std::fs::write(&path, &report).unwrap_or_else(|e| panic!("RUDA_BUDGETS_REPORT: {e}"));
    }
    println!("{checked} budget rules checked");
    assert!(failures.is_empty(), "{} budgets broken:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_rule_matches_a_configuration() {
    let rules = parse_rules(BUDGETS).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<String> = registry().iter().map(|r| r.id.clone()).collect();
    let stale: Vec<String> = rules
        .iter()
        .filter(|r| !ids.iter().any(|id| matches(&r.pattern, id)))
        .map(|r| format!("budgets.txt:{}: `{}` matches no registered configuration", r.line, r.pattern))
        .collect();
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

#[test]
fn patterns_and_rule_precedence() {
    assert!(matches("gemv.*.m1", "gemv.bf16.m1"));
    assert!(!matches("gemv.*.m1", "gemv.bf16.m1.bias"));
    assert!(matches("*", "anything"));
    assert!(matches("a*b*c", "a-b-b-c"));
    assert!(!matches("a*b*c", "a-c-b"));
    let rules = parse_rules("* shared conflicts 0\nx.* shared conflicts 5 -- why\nx.* global_load efficiency 0.5\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let chosen = rules_for(&rules, "x.y");
    assert_eq!(chosen.len(), 2);
    assert_eq!(chosen[0].metric, Metric::Conflicts(5), "the later line wins");
    assert_eq!(rules_for(&rules, "z").len(), 1);
    for bad in ["* shared conflicts", "* nowhere conflicts 0", "* shared efficiency 0.5", "* global_load conflicts 0"] {
        assert!(parse_rules(bad).is_err(), "{bad}");
    }
}
