//! Reads the StableHLO each combinator emits and checks the collective op, its dims, its
//! replica groups (device ids row-major over the mesh) and the manual-sharding form.

use tessera_collectives::prelude::*;
use tessera_collectives::Collective;
use tessera_hlo::DType;

mesh!(DataContext = [Data, Context]);

type X = (Split<Data>, Replicated, Split<Context>, Replicated);

const CONTEXT_GROUPS: &str = "[[0, 1, 2, 3], [4, 5, 6, 7]]";
const DATA_GROUPS: &str = "[[0, 4], [1, 5], [2, 6], [3, 7]]";

/// Builds a program on a 2 x 4 `data` x `context` mesh with one argument sharded as `X`
/// (global `[2, 8, 16, 2]`, per device `[1, 8, 4, 2]`) and returns its text.
fn program(
    body: impl FnOnce(
        &Spmd<'_, DataContext>,
        DTensor<'_, DataContext, X>,
    ) -> Result<(), CollectiveError>,
) -> String {
    let mesh = Mesh::<DataContext>::new([2, 4]).unwrap();
    let p = Program::build("text", &mesh, |p| {
        let x = p.arg::<X>([2, 8, 16, 2], DType::F32)?;
        body(p, x)
    })
    .unwrap();
    let text = p.to_mlir();
    assert!(
        text.contains("mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32"),
        "{text}"
    );
    // Shardy's form: the mesh, the global argument split over it, the body manual over both
    // axes on the per-device block.
    for expected in [
        r#""sdy.mesh"() <{mesh = #sdy.mesh<["data"=2, "context"=4]>, sym_name = "mesh"}>"#,
        r#"%arg0: tensor<2x8x16x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {"context"}, {}]>}"#,
        r#""sdy.manual_computation"(%arg0) <{in_shardings = #sdy.sharding_per_value<[<@mesh, [{"data"}, {}, {"context"}, {}]>]>, manual_axes = #sdy<manual_axes{"data", "context"}>"#,
        "^bb0(%local0: tensor<1x8x4x2xf32>):",
    ] {
        assert!(text.contains(expected), "{expected} in:\n{text}");
    }
    assert!(!text.contains("mhlo.sharding"), "{text}");
    // GSPMD's form: the same body on per-device types, `{manual}`.
    let gspmd = p.to_mlir_gspmd();
    assert!(
        gspmd.contains(r#"%arg0: tensor<1x8x4x2xf32> {mhlo.sharding = "{manual}"}"#),
        "{gspmd}"
    );
    assert!(!gspmd.contains("sdy."), "{gspmd}");
    text
}

/// The ops `op` of `text`, each as one string: its line, and for an op with regions every
/// line up to the region's end (`}) {attributes}`).
fn ops(text: &str, op: &str) -> Vec<String> {
    let quoted = format!("\"{op}\"(");
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !l.contains(&quoted) {
            continue;
        }
        let mut op_text = l.to_string();
        if l.trim_end().ends_with("({") {
            for next in &lines[i + 1..] {
                op_text.push('\n');
                op_text.push_str(next);
                if next.trim_start().starts_with("})") {
                    break;
                }
            }
        }
        found.push(op_text);
    }
    found
}

/// The single op `op`.
fn one(text: &str, op: &str) -> String {
    let mut found = ops(text, op);
    assert_eq!(found.len(), 1, "one {op} expected in:\n{text}");
    found.remove(0)
}

/// The value of `dense<...>` attribute `name` of an op line.
fn dense<'l>(line: &'l str, name: &str) -> &'l str {
    let key = format!("{name} = dense<");
    let start = line
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        + key.len();
    let end = start + line[start..].find('>').unwrap();
    &line[start..end]
}

fn has(line: &str, attr: &str) {
    assert!(line.contains(attr), "`{attr}` expected in\n{line}");
}

#[test]
fn all_to_all_over_context_and_its_inverse() {
    let text = program(|_, x| {
        let y = x.all_to_all::<Context, 1, 2>()?;
        let z = y.all_to_all::<Context, 2, 1>()?;
        y.output::<(Split<Data>, Split<Context>, Replicated, Replicated)>()?;
        z.output::<X>()
    });
    let lines = ops(&text, "stablehlo.all_to_all");
    assert_eq!(lines.len(), 2, "{text}");
    for (line, (split, concat)) in lines.iter().zip([(1, 2), (2, 1)]) {
        has(line, &format!("split_dimension = {split} : i64"));
        has(line, &format!("concat_dimension = {concat} : i64"));
        has(line, "split_count = 4 : i64");
        assert_eq!(dense(line, "replica_groups"), CONTEXT_GROUPS);
        has(line, "channel_handle = #stablehlo.channel_handle<");
    }
    has(&lines[0], "(tensor<1x8x4x2xf32>) -> tensor<1x2x16x2xf32>");
    has(&lines[1], "(tensor<1x2x16x2xf32>) -> tensor<1x8x4x2xf32>");
    assert!(text.contains(
        r#"-> (tensor<2x8x16x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"context"}, {}, {}]>}"#
    ));
    assert!(text
        .contains(r#""sdy.return"(%0, %1) : (tensor<1x2x16x2xf32>, tensor<1x8x4x2xf32>) -> ()"#));
}

#[test]
fn all_to_all_over_data() {
    // dim 0 is split over data: move that split to dim 1.
    let text = program(|_, x| {
        let y = x.all_to_all::<Data, 1, 0>()?;
        y.output::<(Replicated, Split<Data>, Split<Context>, Replicated)>()
    });
    let line = one(&text, "stablehlo.all_to_all");
    has(&line, "split_dimension = 1 : i64");
    has(&line, "concat_dimension = 0 : i64");
    has(&line, "split_count = 2 : i64");
    assert_eq!(dense(&line, "replica_groups"), DATA_GROUPS);
    has(&line, "-> tensor<2x4x4x2xf32>");
}

#[test]
fn all_gather_over_each_axis() {
    let text = program(|_, x| {
        let y = x.all_gather::<Context, 2>()?;
        let z = y.all_gather::<Data, 0>()?;
        z.output::<(Replicated, Replicated, Replicated, Replicated)>()
    });
    let lines = ops(&text, "stablehlo.all_gather");
    assert_eq!(lines.len(), 2);
    has(&lines[0], "all_gather_dim = 2 : i64");
    assert_eq!(dense(&lines[0], "replica_groups"), CONTEXT_GROUPS);
    has(&lines[0], "use_global_device_ids");
    has(&lines[0], "-> tensor<1x8x16x2xf32>");
    has(&lines[1], "all_gather_dim = 0 : i64");
    assert_eq!(dense(&lines[1], "replica_groups"), DATA_GROUPS);
    has(&lines[1], "-> tensor<2x8x16x2xf32>");
}

#[test]
fn psum_and_reduce_scatter() {
    let text = program(|_, x| {
        let v = x
            .map_local_as::<(Split<Data>, Replicated, Replicated, Replicated), Varying<Context>>(
                |_, v| Ok(v),
            )?;
        v.psum::<Context>()?
            .output::<(Split<Data>, Replicated, Replicated, Replicated)>()?;
        v.reduce_scatter::<Context, 1>()?
            .output::<(Split<Data>, Split<Context>, Replicated, Replicated)>()
    });
    let ar = one(&text, "stablehlo.all_reduce");
    assert_eq!(dense(&ar, "replica_groups"), CONTEXT_GROUPS);
    has(&ar, "use_global_device_ids");
    let rs = one(&text, "stablehlo.reduce_scatter");
    has(&rs, "scatter_dimension = 1 : i64");
    assert_eq!(dense(&rs, "replica_groups"), CONTEXT_GROUPS);
    has(&rs, "-> tensor<1x2x4x2xf32>");
    // Both reduce with an add body.
    assert_eq!(ops(&text, "stablehlo.add").len(), 2, "{text}");
}

#[test]
fn ring_shift_pairs_per_group() {
    let text = program(|_, x| {
        x.ring_shift::<Context, 2>(1)?.output::<X>()?;
        x.ppermute::<Data, 0>(&[(0, 1), (1, 0)])?.output::<X>()
    });
    let lines = ops(&text, "stablehlo.collective_permute");
    assert_eq!(lines.len(), 2);
    assert_eq!(
        dense(&lines[0], "source_target_pairs"),
        "[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]"
    );
    assert_eq!(
        dense(&lines[1], "source_target_pairs"),
        "[[0, 4], [4, 0], [1, 5], [5, 1], [2, 6], [6, 2], [3, 7], [7, 3]]"
    );
    for l in &lines {
        has(l, "channel_handle = #stablehlo.channel_handle<");
    }
}

#[test]
fn axis_index_divides_the_partition_id() {
    let text = program(|p, _| {
        let c = p.axis_index::<Context>()?;
        let d = p.axis_index::<Data>()?;
        let _ = (c, d);
        Ok(())
    });
    assert_eq!(ops(&text, "stablehlo.partition_id").len(), 2);
    let consts: Vec<String> = ops(&text, "stablehlo.constant")
        .iter()
        .map(|l| dense(l, "value").to_string())
        .collect();
    // context: (id / 1) % 4; data: (id / 4) % 2.
    assert_eq!(consts, ["1", "4", "4", "2"]);
    assert_eq!(ops(&text, "stablehlo.divide").len(), 2);
    assert_eq!(ops(&text, "stablehlo.remainder").len(), 2);
}

#[test]
fn the_program_records_its_collectives() {
    let mesh = Mesh::<DataContext>::new([2, 4]).unwrap();
    let p = Program::build("tape", &mesh, |p| {
        let x = p.arg::<X>([2, 8, 16, 2], DType::F32)?;
        let y = x.all_to_all::<Context, 1, 2>()?;
        y.all_to_all::<Context, 2, 1>()?.output::<X>()
    })
    .unwrap();
    let calls = p.collectives();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[0].collective.to_string(),
        "all_to_all over context (split 1, concat 2)"
    );
    assert_eq!(calls[1].collective, calls[0].collective.transpose());
    assert_eq!(calls[1].input, calls[0].output);
    match &calls[0].collective {
        Collective::AllToAll { axis, .. } => {
            assert_eq!(axis.groups(), &[vec![0, 1, 2, 3], vec![4, 5, 6, 7]])
        }
        other => panic!("{other}"),
    }
    let info = &p.inputs()[0];
    assert_eq!(info.spec.to_string(), "P(data, None, context, None)");
    assert_eq!(info.global.dims, vec![2, 8, 16, 2]);
    assert_eq!(info.local.dims, vec![1, 8, 4, 2]);
}
