//! Reading libtpu's dumps of one compiled Mosaic kernel (`--xla_jf_dump_to`, final pass):
//! its scheduled VLIW bundles as a control-flow structure, and each bundle's slot use.
//!
//! The files of one kernel share a prefix `<id>-<HLO instruction>-`:
//! - `NN-final_bundles.txt`: one bundle per line (`0x1f5 PF: > { op ;; op ... } /* ... */`,
//!   continuation lines follow some), with the branches `sbr.rel (pred) target = $regionN`,
//!   region markers in comments (`Start region N`, `Start/End empty region N`) and the grid
//!   loop's `/* loop exit test */` comparison holding its trip count;
//! - `NN-final_hlo-static-per-bundle-utilization.txt`: the units' capacities, then one line per
//!   bundle with the slots each unit uses (MXU first);
//! - `NN-schedule-analysis_final_bundles.txt`: the HLO instruction (`custom-call`, its
//!   `backend_config` with the Mosaic body, its `frontend_attributes`).
//!
//! Branches are read as observed with libtpu 0.0.42.1 (v5p): a branch's next 4 bundles are
//! delay slots that run either way, so a taken forward branch at `a` to `t` skips the bundles
//! `a + 5 .. t`; a backward branch closes a loop that starts at its target.

use std::collections::HashMap;

use base64::Engine as _;
use tessera_dsl::mosaic::KernelSchedule;
use tessera_dsl::SCHEDULE_ATTRIBUTE;

/// Bundles after a branch that run whether or not it is taken.
const DELAY_SLOTS: usize = 4;

/// A range of bundles and what it costs when it runs once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Segment {
    /// Bundles issued (cycles without stalls), inner loops counted by their trip counts.
    pub bundles: u64,
    /// MXU slots those bundles use.
    pub mxu_slots: u64,
}

impl std::ops::AddAssign for Segment {
    fn add_assign(&mut self, o: Segment) {
        self.bundles += o.bundles;
        self.mxu_slots += o.mxu_slots;
    }
}

/// One compiled Mosaic kernel as its bundles read.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelBundles {
    /// The HLO instruction (`name.1`, `splash_mha_fwd_no_residuals.1`).
    pub instruction: String,
    /// The kernel's name: the Mosaic function's when its body is text (tessera's), else the
    /// instruction's without its `.N` suffix.
    pub kernel: String,
    /// How often each `when` runs: a schedule given for this kernel's name, else the one
    /// tessera attached to the call (`tessera_schedule`), if any.
    pub schedule: Option<KernelSchedule>,
    /// Bundles in the program.
    pub total: u64,
    /// MXU slots per bundle (the capacity read from the dump).
    pub mxu_capacity: u64,
    /// Bundles outside the grid loop: run once per core.
    pub outside_loop: Segment,
    /// The grid loop's body without the branch regions of the kernel's top-level `when`s:
    /// run at every loop iteration. The whole body when the regions were not identified.
    pub step: Segment,
    /// The top-level `when` regions, in program order; `None` when the branch structure does
    /// not show as many regions as the kernel has `when`s.
    pub whens: Option<Vec<Segment>>,
    /// Branch regions directly in the loop body (inside the pipeline's guard, if there is
    /// one: a lone region holding the others, or the one region beside others whose own
    /// regions are as many as the `when`s): what was matched against the `when`s.
    pub regions_found: usize,
    /// The grid loop's trip count from its exit test (grid steps on this core plus the
    /// pipeline's extra iterations), when it is a constant.
    pub loop_trips: Option<u64>,
}

/// Why a kernel's dump could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// A file misses what every dump of a kernel has.
    #[error("libtpu's dump `{file}` is not as expected: {problem}")]
    Format { file: String, problem: String },
    /// Reading the dump directory failed.
    #[error("reading libtpu's dumps in {dir}: {cause}")]
    Io {
        dir: std::path::PathBuf,
        cause: std::io::Error,
    },
}

/// The dump files of one kernel (their names and texts).
#[derive(Debug, Clone, Default)]
pub struct KernelFiles {
    pub bundles: Option<(String, String)>,
    pub utilization: Option<(String, String)>,
    pub instruction: Option<(String, String)>,
}

/// Splits a dump file name `<id>-<instruction>-<NN>-<what>` into `(id-instruction, what)`.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    let b = name.as_bytes();
    (0..b.len().saturating_sub(3)).rev().find_map(|i| {
        (b[i] == b'-'
            && b[i + 1].is_ascii_digit()
            && b[i + 2].is_ascii_digit()
            && b.get(i + 3) == Some(&b'-'))
        .then(|| (&name[..i], &name[i + 4..]))
    })
}

/// Groups the files libtpu dumped (name, text) by kernel instruction, keeping those of Mosaic
/// kernels (their instruction is a `tpu_custom_call`), in the order their bundles appear.
pub fn group_kernel_files(files: Vec<(String, String)>) -> Vec<(String, KernelFiles)> {
    let mut groups: Vec<(String, KernelFiles)> = Vec::new();
    for (name, text) in files {
        let Some((key, what)) = split_name(&name) else {
            continue;
        };
        let key = key.to_string();
        let i = match groups.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                groups.push((key, KernelFiles::default()));
                groups.len() - 1
            }
        };
        let g = &mut groups[i].1;
        match what {
            "final_bundles.txt" => g.bundles = Some((name, text)),
            "final_hlo-static-per-bundle-utilization.txt" => g.utilization = Some((name, text)),
            "schedule-analysis_final_bundles.txt" => g.instruction = Some((name, text)),
            _ => {}
        }
    }
    // A kernel's schedule analysis is of its own instruction, a `tpu_custom_call` (the
    // program's, `TLP`, lists every instruction).
    groups.retain(|(key, g)| {
        let instruction = key.split_once('-').map_or("", |(_, i)| i);
        g.instruction.as_ref().is_some_and(|(_, t)| {
            instruction_name(t).as_deref() == Some(instruction)
                && t.contains("custom_call_target=\"tpu_custom_call\"")
        })
    });
    groups
}

/// Whether libtpu's dump file `name` is one [`KernelBundles::read`] uses.
pub fn is_kernel_file(name: &str) -> bool {
    split_name(name).is_some_and(|(_, what)| {
        matches!(
            what,
            "final_bundles.txt"
                | "final_hlo-static-per-bundle-utilization.txt"
                | "schedule-analysis_final_bundles.txt"
        )
    })
}

/// One bundle line (with its continuation lines).
struct Bundle<'a> {
    text: &'a str,
}

impl KernelBundles {
    /// Reads one kernel's files, with the schedule in `schedules` of its kernel name, or else
    /// the one tessera attached; the `when` regions are matched when the bundles show as many
    /// as the schedule has paths.
    pub fn read(files: &KernelFiles, schedules: &[KernelSchedule]) -> Result<Self, DumpError> {
        let missing = |what: &str| DumpError::Format {
            file: files
                .bundles
                .as_ref()
                .or(files.instruction.as_ref())
                .map_or_else(|| "?".into(), |(n, _)| n.clone()),
            problem: format!("the kernel's {what} file is missing"),
        };
        let (bname, btext) = files
            .bundles
            .as_ref()
            .ok_or_else(|| missing("final_bundles"))?;
        let (uname, utext) = files
            .utilization
            .as_ref()
            .ok_or_else(|| missing("per-bundle utilization"))?;
        let (_, itext) = files
            .instruction
            .as_ref()
            .ok_or_else(|| missing("schedule analysis"))?;
        let format = |file: &str, problem: String| DumpError::Format {
            file: file.to_string(),
            problem,
        };
        let bundles = split_bundles(btext);
        let (mxu, mxu_capacity) = mxu_per_bundle(utext).map_err(|p| format(uname, p))?;
        if mxu.len() != bundles.len() {
            return Err(format(
                uname,
                format!(
                    "{} utilization lines for {} bundles in {bname}",
                    mxu.len(),
                    bundles.len()
                ),
            ));
        }
        let instruction = instruction_name(itext).unwrap_or_default();
        let kernel = mosaic_function(itext).unwrap_or_else(|| match instruction.rsplit_once('.') {
            Some((stem, n)) if n.chars().all(|c| c.is_ascii_digit()) => stem.to_string(),
            _ => instruction.clone(),
        });
        let schedule = schedules
            .iter()
            .find(|s| s.kernel == kernel)
            .cloned()
            .or_else(|| schedule_attribute(itext));
        let whens = schedule.as_ref().map(|s| s.paths.len());
        let cfg = ControlFlow::read(&bundles);
        Ok(cfg.cost(instruction, kernel, schedule, &mxu, mxu_capacity, whens))
    }
}

/// The bundles of a `final_bundles` file: each starts with its address (`0x1f5` or `0`).
fn split_bundles(text: &str) -> Vec<Bundle<'_>> {
    let mut starts = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        let addr = t.split_whitespace().next().unwrap_or("");
        let is_addr = addr == "0"
            || addr
                .strip_prefix("0x")
                .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()));
        if is_addr && t.contains('{') {
            starts.push(offset);
        }
        offset += line.len();
    }
    starts
        .iter()
        .enumerate()
        .map(|(i, &s)| Bundle {
            text: &text[s..starts.get(i + 1).copied().unwrap_or(text.len())],
        })
        .collect()
}

/// The MXU slots each bundle uses, and the MXU's capacity, from a utilization file.
fn mxu_per_bundle(text: &str) -> Result<(Vec<u64>, u64), String> {
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|l| l.starts_with("== CAPAC"))
        .ok_or("no capacity header")?;
    let units: Vec<&str> = lines
        .next()
        .ok_or("no unit names")?
        .split(',')
        .map(str::trim)
        .collect();
    let column = units
        .iter()
        .position(|u| *u == "MXU")
        .ok_or("no MXU unit")?;
    let capacity: u64 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(column))
        .and_then(|c| c.parse().ok())
        .ok_or("no MXU capacity")?;
    lines
        .by_ref()
        .find(|l| l.starts_with("== UTILIZATION"))
        .ok_or("no utilization section")?;
    let mut mxu = Vec::new();
    for l in lines {
        if l.trim().is_empty() {
            continue;
        }
        let v = l
            .split_whitespace()
            .nth(column)
            .and_then(|c| c.parse::<u64>().ok())
            .ok_or_else(|| format!("unreadable utilization line `{l}`"))?;
        mxu.push(v);
    }
    Ok((mxu, capacity))
}

/// The instruction's name: `%NAME = ` in the schedule analysis.
fn instruction_name(text: &str) -> Option<String> {
    let at = text.find("scheduled bundles (")?;
    let rest = &text[at..];
    let start = rest.find(": %")? + 3;
    let end = start + rest[start..].find(' ')?;
    Some(rest[start..end].to_string())
}

/// The Mosaic function's name when the call's body is MLIR text (`func.func @NAME(`).
fn mosaic_function(text: &str) -> Option<String> {
    const BODY: &str = "\"custom_call_config\":{\"body\":\"";
    let start = text.find(BODY)? + BODY.len();
    let len = text[start..].find('"')?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&text[start..start + len])
        .ok()?;
    let body = String::from_utf8(bytes).ok()?;
    let at = body.find("func.func @")? + "func.func @".len();
    let end = at + body[at..].find('(')?;
    Some(body[at..end].to_string())
}

/// The schedule tessera attached as a frontend attribute. The HLO text prints a value that
/// is a JSON object as it is (`tessera_schedule={"kernel":..}`), other values quoted.
fn schedule_attribute(text: &str) -> Option<KernelSchedule> {
    let key = format!("{SCHEDULE_ATTRIBUTE}=");
    let start = text.find(&key)? + key.len();
    let rest = &text[start..];
    let value = if rest.starts_with('{') {
        // The balanced object (braces inside JSON strings do not count).
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        let end = rest.char_indices().find_map(|(i, c)| {
            match (in_string, escaped, c) {
                (true, true, _) => escaped = false,
                (true, false, '\\') => escaped = true,
                (true, false, '"') => in_string = false,
                (false, _, '"') => in_string = true,
                (false, _, '{') => depth += 1,
                (false, _, '}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
            None
        })?;
        rest[..end].to_string()
    } else {
        let mut value = String::new();
        let mut chars = rest.strip_prefix('"')?.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    't' => value.push('\t'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        }
        value
    };
    KernelSchedule::from_json(&value).ok()
}

/// The branch structure of a kernel's bundles.
struct ControlFlow {
    /// Forward branch regions (the bundles a taken branch skips), `start..end`.
    regions: Vec<std::ops::Range<usize>>,
    /// Loops `start..end` (the back edge's delay slots included) with their trip counts.
    loops: Vec<(std::ops::Range<usize>, Option<u64>)>,
    bundles: usize,
}

impl ControlFlow {
    fn read(bundles: &[Bundle<'_>]) -> Self {
        // Where each region starts: the first bundle whose comment starts it.
        let mut region_at: HashMap<&str, usize> = HashMap::new();
        for (i, b) in bundles.iter().enumerate() {
            for marker in ["Start region ", "Start/End empty region "] {
                for (at, _) in b.text.match_indices(marker) {
                    let id = number_at(&b.text[at + marker.len()..]);
                    region_at.entry(id).or_insert(i);
                }
            }
        }
        let mut regions = Vec::new();
        let mut loops = Vec::new();
        for (i, b) in bundles.iter().enumerate() {
            for (at, _) in b.text.match_indices("sbr.rel") {
                let rest = &b.text[at..];
                let Some(t) = rest.find("target = $region") else {
                    continue;
                };
                // A region no bundle starts is the program's exit (a kernel whose grid has
                // no parallel dim skips to it on the second TensorCore).
                let id = number_at(&rest[t + "target = $region".len()..]);
                let target = region_at.get(id).copied().unwrap_or(bundles.len());
                if target > i {
                    regions.push((i + 1 + DELAY_SLOTS).min(target)..target);
                } else {
                    let end = (i + 1 + DELAY_SLOTS).min(bundles.len());
                    let trips = bundles[target..=i]
                        .iter()
                        .rev()
                        .find_map(|b| exit_test_bound(b.text));
                    loops.push((target..end, trips));
                }
            }
        }
        ControlFlow {
            regions,
            loops,
            bundles: bundles.len(),
        }
    }

    fn cost(
        &self,
        instruction: String,
        kernel: String,
        schedule: Option<KernelSchedule>,
        mxu: &[u64],
        mxu_capacity: u64,
        whens: Option<usize>,
    ) -> KernelBundles {
        // The grid loop is the outermost (longest) loop; loops inside it repeat their bundles.
        let grid = self.loops.iter().max_by_key(|(r, _)| r.len()).cloned();
        let mut weight = vec![1u64; self.bundles];
        for (r, trips) in &self.loops {
            if Some(r) != grid.as_ref().map(|(g, _)| g) {
                for w in &mut weight[r.clone()] {
                    *w *= trips.unwrap_or(1).max(1);
                }
            }
        }
        let segment = |r: std::ops::Range<usize>| {
            let mut s = Segment::default();
            for i in r {
                s.bundles += weight[i];
                s.mxu_slots += weight[i] * mxu[i];
            }
            s
        };
        let body = grid.as_ref().map_or(0..0, |(r, _)| r.clone());
        let mut outside = segment(0..self.bundles);
        let mut step = segment(body.clone());
        outside.bundles -= step.bundles;
        outside.mxu_slots -= step.mxu_slots;
        // The regions directly in the loop body, and inside a lone guard region.
        let inside: Vec<_> = self
            .regions
            .iter()
            .filter(|r| r.start >= body.start && r.end <= body.end && !r.is_empty())
            .cloned()
            .collect();
        let top = |within: &std::ops::Range<usize>| -> Vec<std::ops::Range<usize>> {
            let mut level: Vec<_> = inside
                .iter()
                .filter(|r| {
                    *r != within
                        && r.start >= within.start
                        && r.end <= within.end
                        && !inside.iter().any(|o| {
                            o != *r
                                && o != within
                                && o.start >= within.start
                                && o.end <= within.end
                                && o.start <= r.start
                                && r.end <= o.end
                        })
                })
                .cloned()
                .collect();
            level.sort_by_key(|r| r.start);
            level.dedup();
            level
        };
        // A lone region holding the others is the pipeline's guard (it skips the kernel body
        // in the loop's extra iterations): the `when`s are inside it.
        let mut level = top(&body);
        if let [guard] = level.as_slice() {
            let inner = top(guard);
            if !inner.is_empty() && (whens != Some(1) || inner.len() == 1) {
                level = inner;
            }
        }
        // Beside the guard there may be other regions: the pipeline's prefetch of the next
        // step's blocks, skipped in its last iterations (tokamax's dK/dV kernel). Where the
        // regions at this level do not match the `when`s, the one region whose own regions
        // do is the guard.
        if let Some(k) = whens.filter(|&k| k != level.len()) {
            let holding: Vec<_> = level.iter().filter(|r| top(r).len() == k).collect();
            if let [guard] = holding.as_slice() {
                level = top(guard);
            }
        }
        let regions_found = level.len();
        let matched = whens.filter(|&k| k == level.len()).map(|_| {
            let segs: Vec<Segment> = level.iter().map(|r| segment(r.clone())).collect();
            for s in &segs {
                step.bundles -= s.bundles;
                step.mxu_slots -= s.mxu_slots;
            }
            segs
        });
        KernelBundles {
            instruction,
            kernel,
            schedule,
            total: self.bundles as u64,
            mxu_capacity,
            outside_loop: outside,
            step,
            whens: matched,
            regions_found,
            loop_trips: grid.and_then(|(_, t)| t),
        }
    }
}

/// The decimal number at the start of `s` (as text).
fn number_at(s: &str) -> &str {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    &s[..end]
}

/// The bound of a loop's exit test in this bundle (`scmp.ge.s32.totalorder %s, 258 /* loop
/// exit test */`), when it is a constant.
fn exit_test_bound(text: &str) -> Option<u64> {
    let at = text.find("/* loop exit test")?;
    let before = &text[..at];
    let op = before.rfind("scmp.")?;
    before[op..].rsplit(',').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 42 bundles: 3 before a loop of 10 iterations from `0x3` to its back edge at `0x22`
    /// (and 4 delay slots: 36 bundles), holding a guard region `0x9 .. 0x20`, inside it two
    /// `when` regions `0xe .. 0x10` (two matmul bundles) and `0x16 .. 0x1a`; 3 after.
    fn kernel() -> String {
        kernel_with(&[])
    }

    /// [`kernel`] with some bundles' text replaced.
    fn kernel_with(replaced: &[(usize, &str)]) -> String {
        let mut lines = vec![
            "= control target key start".to_string(),
            "= control target key end".to_string(),
            String::new(),
        ];
        let body = |i: usize| -> String {
            if let Some((_, text)) = replaced.iter().find(|(at, _)| *at == i) {
                return text.to_string();
            }
            match i {
                0x3 => "{ %a = sadd.s32 1, %b } /* Start region 9 */".into(),
                0x4 => "{ %1 = sbr.rel (%p1) target = $region20 }".into(),
                0x9 => "{ %2 = sbr.rel (%p2) target = $region21 }".into(),
                0xe | 0xf => "{ %v = vmatmul.bf16 %x }".into(),
                0x10 => "{ } /* Start/End empty region 21 */".into(),
                0x11 => "{ %3 = sbr.rel (!%p3) target = $region22 }".into(),
                0x1a => "{ } /* Start/End empty region 22 */".into(),
                0x20 => "{ } /* Start/End empty region 20 */".into(),
                0x21 => "{ %p = scmp.ge.s32.totalorder %s4, 10 /* loop exit test */ }".into(),
                0x22 => "{ %5 = sbr.rel (!%p) target = $region9 }".into(),
                _ => "{ %s = sadd.s32 1, %s }".into(),
            }
        };
        for i in 0..42 {
            let addr = if i == 0 {
                "0".to_string()
            } else {
                format!("{i:#x}")
            };
            let mark = if i == 3 { "LB:" } else { "   " };
            lines.push(format!("  {addr} {mark} > {}", body(i)));
            if i == 0 {
                lines.push("hlo: k.1".into());
            }
        }
        lines.join("\n")
    }

    fn utilization() -> String {
        let mut text =
            "== CAPACTIY:\nMXU, XLU, VALU\n    4     3     4\n== UTILIZATION:\n".to_string();
        for i in 0..42 {
            text.push_str(if i == 0xe || i == 0xf {
                "2 0 1\n"
            } else {
                "0 0 1\n"
            });
        }
        text
    }

    fn files(schedule: &str) -> KernelFiles {
        files_of(schedule, kernel())
    }

    fn files_of(schedule: &str, bundles: String) -> KernelFiles {
        let instruction = format!(
            "Schedule analysis:\n\t42.00 scheduled bundles (100.00%): %k.1 = (f32[8]) \
             custom-call(%a), custom_call_target=\"tpu_custom_call\", \
             frontend_attributes={{tessera_schedule={schedule}}}, backend_config={{}}"
        );
        KernelFiles {
            bundles: Some(("1-k.1-03-final_bundles.txt".into(), bundles)),
            utilization: Some((
                "1-k.1-01-final_hlo-static-per-bundle-utilization.txt".into(),
                utilization(),
            )),
            instruction: Some((
                "1-k.1-02-schedule-analysis_final_bundles.txt".into(),
                instruction,
            )),
        }
    }

    #[test]
    fn names_split_into_kernel_and_file() {
        assert_eq!(
            split_name("17961-splash_mha_fwd.1-03-final_bundles.txt"),
            Some(("17961-splash_mha_fwd.1", "final_bundles.txt"))
        );
        assert_eq!(
            split_name("1-<late-init>-02-schedule-analysis_final_bundles.txt"),
            Some(("1-<late-init>", "schedule-analysis_final_bundles.txt"))
        );
        assert!(is_kernel_file(
            "1-k.1-01-final_hlo-static-per-bundle-utilization.txt"
        ));
        assert!(!is_kernel_file(
            "1-k.1-00-pre-finalize-registers-and-allocations.txt"
        ));
        assert_eq!(split_name("vmem_report.html"), None);
    }

    #[test]
    fn regions_loop_and_slots_are_read() {
        let schedule = r#"{"kernel":"k","grid":[2,5],"dimension_semantics":["parallel","arbitrary"],"paths":[{"path":"init","runs":[1,1]},{"path":"finalize","runs":[1,1]}]}"#;
        let k = KernelBundles::read(&files(schedule), &[]).unwrap();
        assert_eq!(k.instruction, "k.1");
        assert_eq!(k.kernel, "k");
        assert_eq!(k.schedule.as_ref().unwrap().grid, vec![2, 5]);
        assert_eq!((k.total, k.mxu_capacity, k.loop_trips), (42, 4, Some(10)));
        assert_eq!(k.outside_loop.bundles, 6);
        assert_eq!(k.regions_found, 2);
        let whens = k.whens.unwrap();
        assert_eq!(
            whens[0],
            Segment {
                bundles: 2,
                mxu_slots: 4
            }
        );
        assert_eq!(
            whens[1],
            Segment {
                bundles: 4,
                mxu_slots: 0
            }
        );
        assert_eq!(
            k.step,
            Segment {
                bundles: 30,
                mxu_slots: 0
            }
        );
    }

    #[test]
    fn the_schedule_is_read_as_an_object_or_a_string() {
        let json = r#"{"kernel":"k","grid":[2],"dimension_semantics":["arbitrary"],"paths":[{"path":"a{","runs":[1]}]}"#;
        let raw = format!("x, frontend_attributes={{tessera_schedule={json}}}, y");
        assert_eq!(schedule_attribute(&raw).unwrap().paths[0].path, "a{");
        let quoted = format!(
            "frontend_attributes={{tessera_schedule=\"{}\"}}",
            json.replace('"', "\\\"")
        );
        assert_eq!(schedule_attribute(&quoted).unwrap().grid, vec![2]);
    }

    #[test]
    fn a_when_count_the_structure_does_not_show_is_unmatched() {
        let k = KernelBundles::read(&files("{}"), &[]).unwrap();
        assert!(k.schedule.is_none());
        assert_eq!((k.whens, k.regions_found), (None, 2));
        let three = KernelSchedule::from_json(
            r#"{"kernel":"k","grid":[4],"dimension_semantics":["arbitrary"],"paths":[
                {"path":"a","runs":[1]},{"path":"b","runs":[1]},{"path":"c","runs":[1]}]}"#,
        )
        .unwrap();
        let k = KernelBundles::read(&files("{}"), &[three]).unwrap();
        assert_eq!(k.schedule.as_ref().unwrap().paths.len(), 3);
        assert_eq!((k.whens, k.regions_found), (None, 2));
        assert_eq!(
            k.step,
            Segment {
                bundles: 36,
                mxu_slots: 4
            }
        );
    }

    #[test]
    fn the_guard_beside_a_prefetch_region_holds_the_whens() {
        // A prefetch region `0x8 .. 0x9` beside the guard, and a third `when` `0x1f .. 0x20`
        // in the guard: two regions at the top of the loop body, three inside the guard.
        let bundles = kernel_with(&[
            (
                0x3,
                "{ %6 = sbr.rel (%p6) target = $region23 } /* Start region 9 */",
            ),
            (
                0x9,
                "{ %2 = sbr.rel (%p2) target = $region21 } /* Start/End empty region 23 */",
            ),
            (
                0x1a,
                "{ %7 = sbr.rel (%p7) target = $region24 } /* Start/End empty region 22 */",
            ),
            (
                0x20,
                "{ } /* Start/End empty region 20 :: Start/End empty region 24 */",
            ),
        ]);
        let three = r#"{"kernel":"k","grid":[2,5],"dimension_semantics":["parallel","arbitrary"],"paths":[{"path":"init","runs":[1,1]},{"path":"run","runs":[3,3]},{"path":"end","runs":[1,1]}]}"#;
        let k = KernelBundles::read(&files_of(three, bundles), &[]).unwrap();
        assert_eq!(k.regions_found, 3);
        let bundles_of: Vec<u64> = k.whens.unwrap().iter().map(|s| s.bundles).collect();
        assert_eq!(bundles_of, vec![2, 4, 1]);
        // The prefetch region runs at every step.
        assert_eq!(k.step.bundles, 36 - 2 - 4 - 1);
    }
}
