//! Ulysses attention's forward as one kernel over a context axis: the all-to-all of q, k and
//! v (heads for sequence), the attention, and the all-to-all of the output back, with the
//! exchanges overlapping the attention (MaxText runs them as three XLA collectives around
//! the attention kernel, each on the layer's critical path).

use tessera_dsl::prelude::*;
use tessera_dsl::{wait_copy, HasAxis, HostArray, IntoIndex, KernelDef, MeshAxis, MeshShape};

use crate::collective::meet_all;

/// Ulysses attention's forward over the axis `A` of `N` devices, fused: `q`, `k`, `v` are
/// this device's sequence shard of every head (`[H, SL, D]` in HBM, the whole sequence `S =
/// N SL` in axis order), `out` the same for the output: `softmax(scale q k^T) v` per head
/// over the whole sequence (causal where `causal`: query `i` sees keys `<= i` of the whole
/// sequence), `scale = 1 / sqrt(D)`. Device `d` attends its `HL = H / N` heads `d HL ..
/// (d + 1) HL`, one per grid step:
///
/// - the step before (the first step for head 0) has started the exchange of the head's
///   rows: every device copies its `SL` rows of that head of q, k and v into slot `me` of a
///   `[2, S, D]` VMEM buffer of the head's owner (double-buffered, so the next head's
///   exchange runs during this head's attention), on a receive semaphore per (tensor,
///   buffer, source);
/// - it waits the head's rows, starts the next head's exchange (once every owner has
///   signalled that it finished the head that used that buffer), and computes the head
///   chunk by chunk of `SL` query rows, in the order `me, me + 1, ...`, with an online
///   softmax over blocks of `block` keys;
/// - each finished chunk is copied at once to the device whose rows it holds (its head's
///   rows of `out` there), while the next chunk is computed.
///
/// Every remote copy goes to the device `k` along (`Devices::shifted`), so each is a fixed
/// permutation of the axis; the devices meet at the barrier before the first.
#[tpu_kernel(
    grid = (H / devices.size::<A>(),),
    name = "ulysses_attention",
    require(
        H % devices.size::<A>() == 0,
        "{H} heads do not split over the {} devices of the axis; Ulysses gives each device \
         H / devices heads",
        devices.size::<A>()
    ),
    require(
        block > 0 && SL % block == 0,
        "block = {block} does not divide the {SL} rows each device holds; choose one that does"
    )
)]
pub fn ulysses_attention_of<T: Element, M: MeshShape + HasAxis<A>, A: MeshAxis>(
    #[shape(H, SL, D)] q: Hbm<T>,
    #[shape(H, SL, D)] k: Hbm<T>,
    #[shape(H, SL, D)] v: Hbm<T>,
    #[shape(H, SL, D)] mut out: HbmMut<T>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut qg: Vmem<T>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut kg: Vmem<T>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut vg: Vmem<T>,
    #[scratch(devices.size::<A>() * SL, D)] mut og: Vmem<T>,
    #[scratch(3, 2, devices.size::<A>())] send: DmaSem,
    #[scratch(3, 2, devices.size::<A>())] recv: DmaSem,
    #[scratch(devices.size::<A>())] out_send: DmaSem,
    #[scratch(devices.size::<A>())] out_recv: DmaSem,
    #[scratch(devices.size::<A>())] ready: Sem,
    devices: Devices<M>,
    #[comptime] block: usize,
    #[comptime] causal: bool,
) {
    let n = devices.size::<A>();
    let heads_here = H / n;
    let hl = program_id(0);
    let me = devices.index::<A>();
    let along = |k: usize| (me + k as i32) % n as i32;
    let back = |k: usize| (me + (n - k) as i32) % n as i32;
    // Head `h` of a device's q, k, v or out, and slot `s` (source `s`'s rows) of buffer `b`.
    let head = |h: Value| [ds(h, 1), all(), all()];
    let slot = |b: Value, s: Value| [ds(b, 1), ds(s * SL as i32, SL), all()];
    let inputs = [&q, &k, &v];

    // Starts the exchange of local head `h` into buffer `b`: to the device `k` along, its
    // head `h` (head `(me + k) HL + h` here) into slot `me` there.
    let start_exchange = |gathered: &mut [&mut Vmem<T>; 3], h: Value, b: Value| {
        for (t, (x, g)) in inputs.iter().zip(gathered.iter_mut()).enumerate() {
            let t = t as i32;
            let own = x.at(&head(me * heads_here as i32 + h));
            async_copy(
                own,
                g.at_mut(&slot(b, me)),
                recv.at_nd([t.into_index(), b, me]),
            )
            .detach();
            for k in 1..n {
                let to = along(k);
                let src = x.at(&head(to * heads_here as i32 + h));
                let (sent, landed) = (
                    send.at_nd([t.into_index(), b, to]),
                    recv.at_nd([t.into_index(), b, me]),
                );
                remote_copy(
                    src,
                    g.at_mut(&slot(b, me)),
                    sent,
                    landed,
                    devices.shifted::<A>(k as i64),
                )
                .detach();
            }
        }
    };
    // Waits the exchange of local head `h` into buffer `b`: this device's sends and every
    // source's rows.
    let wait_exchange = |gathered: &mut [&mut Vmem<T>; 3], h: Value, b: Value| {
        for (t, (x, g)) in inputs.iter().zip(gathered.iter_mut()).enumerate() {
            let t = t as i32;
            let own = x.at(&head(me * heads_here as i32 + h));
            wait_copy(
                own,
                g.at_mut(&slot(b, me)),
                recv.at_nd([t.into_index(), b, me]),
            );
            for k in 1..n {
                let (to, from) = (along(k), back(k));
                let src = x.at(&head(to * heads_here as i32 + h));
                wait_copy(
                    src,
                    g.at_mut(&slot(b, me)),
                    send.at_nd([t.into_index(), b, to]),
                );
                let arriving = x.at(&head(me * heads_here as i32 + h));
                wait_copy(
                    arriving,
                    g.at_mut(&slot(b, from)),
                    recv.at_nd([t.into_index(), b, from]),
                );
            }
        }
    };

    let b = hl % 2;
    let mut gathered = [&mut qg, &mut kg, &mut vg];
    when(hl.eq(0), || {
        if n > 1 {
            meet_all::<M, A>(&devices);
        }
        start_exchange(&mut gathered, hl, b);
    });
    wait_exchange(&mut gathered, hl, b);
    // The next head's exchange into the other buffer, once every owner is done with the
    // head that used it (the one before this), which it signals below.
    when((hl + 1).lt(heads_here as i32), || {
        when(hl.ge(1), || {
            for k in 1..n {
                ready.at(along(k)).wait(1);
            }
        });
        start_exchange(&mut gathered, hl + 1, (hl + 1) % 2);
    });

    // The head's attention, one chunk of SL query rows at a time (chunk `s` holds device
    // `s`'s rows), each sent to its device as soon as it is done.
    let scale = 1.0 / (D as f32).sqrt();
    let blocks_per_chunk = (SL / block) as i32;
    for k in 0..n {
        let s = along(k);
        fori_loop(0, blocks_per_chunk, (), |i, ()| {
            let row0 = s * SL as i32 + i * block as i32;
            let rows = [ds(b, 1), ds(row0, block), all()];
            let qi = qg.at(&rows).load().reshape(&[block, D]);
            let qi = (qi.cast(DType::F32) * scale).cast(T::DTYPE);
            // Key blocks: all of them, or causally up to this query block's last row.
            let key_blocks = if causal {
                row0 / block as i32 + 1
            } else {
                ((n * SL / block) as i32).into_index()
            };
            let init = (
                constant(DType::F32, &[block, 1], f32::NEG_INFINITY),
                constant(DType::F32, &[block, 1], 0.0),
                constant(DType::F32, &[block, D], 0.0),
            );
            let (_, l, acc) = fori_loop(0, key_blocks, init, |j, (m, l, acc)| {
                let keys = [ds(b, 1), ds(j * block as i32, block), all()];
                let kj = kg.at(&keys).load().reshape(&[block, D]);
                let vj = vg.at(&keys).load().reshape(&[block, D]);
                let mut s_ij = dot_nt(qi, kj);
                if causal {
                    let q_pos = iota(DType::I32, &[block, block], 0) + row0;
                    let k_pos = iota(DType::I32, &[block, block], 1) + j * block as i32;
                    s_ij = select(k_pos.le(q_pos), s_ij, f32::NEG_INFINITY);
                }
                let m_new = m.maximum(s_ij.max_keepdims(-1));
                let alpha = (m - m_new).exp();
                let p = (s_ij - m_new).exp();
                let l_new = alpha * l + p.sum_keepdims(-1);
                let acc_new = acc * alpha + dot(p.cast(T::DTYPE), vj);
                (m_new, l_new, acc_new)
            });
            let o = (acc / l).cast(T::DTYPE);
            og.at_mut(&[ds(row0, block), all()]).store(o);
        });
        // Chunk `s` to device `s` (the device `k` along), as its rows of head `me HL + hl`.
        let chunk = [ds(s * SL as i32, SL), all()];
        let dst = head(me * heads_here as i32 + hl);
        if k == 0 {
            async_copy(og.at(&chunk), out.at_mut(&dst), out_recv.at(me)).wait();
        } else {
            let (sent, landed) = (out_send.at(s), out_recv.at(me));
            remote_copy(
                og.at(&chunk),
                out.at_mut(&dst),
                sent,
                landed,
                devices.shifted::<A>(k as i64),
            )
            .detach();
        }
    }
    // This step's chunks: sent, and every owner's chunk of this device's rows arrived (head
    // `from HL + hl` from the device `k` back).
    for k in 1..n {
        let (to, from) = (along(k), back(k));
        let chunk = [ds(to * SL as i32, SL), all()];
        wait_copy(
            og.at(&chunk),
            out.at_mut(&head(me * heads_here as i32 + hl)),
            out_send.at(to),
        );
        let mine = [ds(me * SL as i32, SL), all()];
        let arrived = head(from * heads_here as i32 + hl);
        wait_copy(og.at(&mine), out.at_mut(&arrived), out_recv.at(from));
    }
    // Done with this head's buffer: the owners may send the head after next into it.
    when((hl + 2).lt(heads_here as i32), || {
        for k in 1..n {
            ready.at(me).signal_to(1, devices.shifted::<A>(k as i64));
        }
    });
}

/// [`ulysses_attention_of`] for f32.
pub fn ulysses_attention<M: MeshShape + HasAxis<A>, A: MeshAxis>(
    block: usize,
    causal: bool,
) -> KernelDef {
    ulysses_attention_of::<f32, M, A>(block, causal)
}

/// The f64 reference of [`ulysses_attention_of`], written apart from it: every device's
/// `out` from every device's `q`, `k`, `v` shards (`[H, SL, D]` each, in axis order), by
/// dense attention over the whole sequence per head.
pub fn ulysses_attention_reference(
    q: &[HostArray],
    k: &[HostArray],
    v: &[HostArray],
    causal: bool,
) -> Vec<Vec<f64>> {
    let n = q.len();
    let [h, sl, d] = [q[0].shape()[0], q[0].shape()[1], q[0].shape()[2]];
    let s = n * sl;
    // The whole sequence of head `hh` of `x`: row `r` is device `r / sl`'s row `r % sl`.
    let whole = |x: &[HostArray], hh: usize| -> Vec<f64> {
        (0..n)
            .flat_map(|dev| x[dev].to_f64_vec()[hh * sl * d..(hh + 1) * sl * d].to_vec())
            .collect()
    };
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![vec![0.0; h * sl * d]; n];
    for hh in 0..h {
        let (qh, kh, vh) = (whole(q, hh), whole(k, hh), whole(v, hh));
        for i in 0..s {
            let visible = if causal { i + 1 } else { s };
            let logits: Vec<f64> = (0..visible)
                .map(|j| scale * (0..d).map(|c| qh[i * d + c] * kh[j * d + c]).sum::<f64>())
                .collect();
            let top = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = logits.iter().map(|x| (x - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            let (dev, row) = (i / sl, i % sl);
            for c in 0..d {
                let o: f64 = (0..visible).map(|j| weights[j] * vh[j * d + c]).sum();
                out[dev][(hh * sl + row) * d + c] = o / total;
            }
        }
    }
    out
}
