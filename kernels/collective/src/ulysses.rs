//! Ulysses attention as one kernel per direction over a context axis: the all-to-all of q,
//! k and v (heads for sequence), the attention, and the all-to-all of the output back (of
//! dq, dk and dv in the backward), with the exchanges overlapping the attention (MaxText
//! runs them as XLA collectives around the attention kernel, each on the layer's critical
//! path). Each direction has two kernels: one gathers a head's whole sequence in VMEM
//! ([`ulysses_attention_of`], [`ulysses_attention_bwd_of`]), the other stages it in HBM and
//! fetches it into VMEM block by block, for sequences whose heads do not fit VMEM
//! ([`ulysses_attention_staged_of`], [`ulysses_attention_bwd_staged_of`]).

use tessera_dsl::prelude::*;
use tessera_dsl::{
    make_async_copy, wait_copy, Carry, CopyDescriptor, CopyDest, HasAxis, HbmWindowMut, HostArray,
    Idx, IntoIndex, KernelDef, MeshAxis, MeshShape, VmemWindowMut,
};

use crate::collective::meet_all;

/// How the fused Ulysses kernels form their logits: `scale q k^T` (`scale` by default
/// `1/sqrt(D)`), capped as `cap tanh(logits / cap)` where a soft cap is set (Gemma 2's).
/// Held as f32 bits so a kernel's comptime parameters hash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Logits {
    scale_bits: Option<u32>,
    soft_cap_bits: Option<u32>,
}

impl Logits {
    /// `scale` (`None`: `1/sqrt(D)`) and `soft_cap` (`None`: uncapped).
    pub fn new(scale: Option<f32>, soft_cap: Option<f32>) -> Self {
        Logits {
            scale_bits: scale.map(f32::to_bits),
            soft_cap_bits: soft_cap.map(f32::to_bits),
        }
    }

    /// The scale of head dim `d`.
    pub fn scale(&self, d: usize) -> f32 {
        self.scale_bits
            .map_or(1.0 / (d as f32).sqrt(), f32::from_bits)
    }

    /// The soft cap, if any.
    pub fn soft_cap(&self) -> Option<f32> {
        self.soft_cap_bits.map(f32::from_bits)
    }

    /// `scaled q k^T` (the queries already scaled) capped where a soft cap is set.
    fn of(&self, raw: Value) -> Value {
        match self.soft_cap() {
            Some(cap) => (raw * (1.0 / cap)).tanh() * cap,
            None => raw,
        }
    }

    /// A cotangent of the capped logits `capped` as one of the logits before the cap:
    /// times `1 - tanh^2 = 1 - (capped / cap)^2`.
    fn uncapped(&self, d_capped: Value, capped: Value) -> Value {
        match self.soft_cap() {
            Some(cap) => {
                let t = capped * (1.0 / cap);
                d_capped * (1.0 - t * t)
            }
            None => d_capped,
        }
    }
}

/// Which keys a query sees, by position in the whole sequence: the masks the fused Ulysses
/// kernels take (splash's full, causal, local and chunked causal masks, without offsets).
/// Every query sees itself under each, so no row is left without keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Visibility {
    /// Every key.
    Full,
    /// Keys `k <= q`.
    Causal,
    /// Keys `q - left <= k <= q + right` (`None`: that side unbounded; splash's local mask).
    Local {
        left: Option<u32>,
        right: Option<u32>,
    },
    /// Keys `k <= q` in `q`'s chunk of `chunk` positions (`k / chunk == q / chunk`; Llama
    /// 4's chunked attention). `chunk` is positive.
    ChunkedCausal { chunk: u32 },
}

impl From<bool> for Visibility {
    /// `true`: causal, `false`: full.
    fn from(causal: bool) -> Self {
        if causal {
            Visibility::Causal
        } else {
            Visibility::Full
        }
    }
}

impl Visibility {
    /// Whether query `q` sees key `k` (positions in the whole sequence), on the host.
    pub fn sees(&self, q: usize, k: usize) -> bool {
        match *self {
            Visibility::Full => true,
            Visibility::Causal => k <= q,
            Visibility::Local { left, right } => {
                left.is_none_or(|l| k + l as usize >= q)
                    && right.is_none_or(|r| k <= q + r as usize)
            }
            Visibility::ChunkedCausal { chunk } => {
                k <= q && k / chunk as usize == q / chunk as usize
            }
        }
    }

    /// The key blocks `lo .. hi` (of `s / block`) that query block `row0 .. row0 + block`
    /// meets: every block holding a key one of its rows sees.
    fn key_blocks(&self, row0: Value, s: usize, block: usize) -> (Value, Value) {
        let (b, all) = (block as i32, (s / block) as i32);
        let (first, last_row) = (0.into_index(), row0 + (b - 1));
        match *self {
            Visibility::Full => (first, all.into_index()),
            Visibility::Causal => (first, row0 / b + 1),
            Visibility::Local { left, right } => (
                left.map_or(first, |l| (row0 - l as i32).maximum(0) / b),
                right.map_or(all.into_index(), |r| {
                    ((last_row + r as i32) / b + 1).minimum(all)
                }),
            ),
            Visibility::ChunkedCausal { chunk } => {
                let c = chunk as i32;
                (row0 / c * c / b, row0 / b + 1)
            }
        }
    }

    /// The query blocks `lo .. hi` (of `s / block`) that see a key of key block `j`.
    fn query_blocks(&self, j: Value, s: usize, block: usize) -> (Value, Value) {
        let (b, all) = (block as i32, (s / block) as i32);
        let (col0, last_col) = (j * b, j * b + (b - 1));
        match *self {
            Visibility::Full => (0.into_index(), all.into_index()),
            Visibility::Causal => (j, all.into_index()),
            Visibility::Local { left, right } => (
                right.map_or(0.into_index(), |r| (col0 - r as i32).maximum(0) / b),
                left.map_or(all.into_index(), |l| {
                    ((last_col + l as i32) / b + 1).minimum(all)
                }),
            ),
            Visibility::ChunkedCausal { chunk } => {
                let c = chunk as i32;
                // The last query of the last key's chunk.
                (
                    j,
                    ((last_col / c + 1) * c - 1).minimum(s as i32 - 1) / b + 1,
                )
            }
        }
    }

    /// Logits `[block, block]` of queries from `row0` and keys from `col0`, [`MASKED`] where
    /// the query does not see the key.
    fn masked(&self, logits: Value, row0: Value, col0: Value, block: usize) -> Value {
        let q = || iota(DType::I32, &[block, block], 0) + row0;
        let k = || iota(DType::I32, &[block, block], 1) + col0;
        let sees = match *self {
            Visibility::Full => return logits,
            Visibility::Causal => k().le(q()),
            Visibility::Local { left, right } => {
                let after = left.map(|l| (k() + l as i32).ge(q()));
                let before = right.map(|r| k().le(q() + r as i32));
                match (after, before) {
                    (Some(a), Some(b)) => a & b,
                    (Some(x), None) | (None, Some(x)) => x,
                    (None, None) => return logits,
                }
            }
            Visibility::ChunkedCausal { chunk } => {
                let c = chunk as i32;
                k().le(q()) & (k() / c).eq(q() / c)
            }
        };
        select(sees, logits, MASKED)
    }
}

/// A buffer the exchange lands gathered heads in: a VMEM scratch (the whole head read in
/// place) or an HBM output (the head staged there and fetched block by block, where it does
/// not fit VMEM).
trait Landing<T: Element> {
    type Window<'a>: CopyDest<'a, T>
    where
        Self: 'a;

    fn landing<'a>(&'a mut self, idx: &[Idx]) -> Self::Window<'a>;
}

impl<T: Element> Landing<T> for Vmem<T> {
    type Window<'a> = VmemWindowMut<'a, T>;

    fn landing<'a>(&'a mut self, idx: &[Idx]) -> Self::Window<'a> {
        self.at_mut(idx)
    }
}

impl<T: Element> Landing<T> for HbmMut<T> {
    type Window<'a> = HbmWindowMut<'a, T>;

    fn landing<'a>(&'a mut self, idx: &[Idx]) -> Self::Window<'a> {
        self.at_mut(idx)
    }
}

/// How the heads of a Ulysses kernel travel: every device holds `rows` rows (along dim 1) of
/// every head of some `[H, rows, ..]` arrays and owns `HL = H / N` heads; local head `h` of
/// the device at position `p` is head `p HL + h`. Gathered, a head's whole sequence sits in
/// a `[2, N rows, ..]` buffer (two heads in flight; VMEM scratch, or an HBM output where it
/// is staged: [`Landing`]), slot `s` holding device `s`'s rows,
/// and lands on one receive semaphore per buffer that every source and array share; the
/// sends likewise share one per buffer. DMA semaphores count bytes, and every wait of a head
/// is done before its rows are read, so a wait that another source's bytes satisfied first
/// is made up by the waits after it. Head `h + 2`, the next to land on buffer `h % 2`'s
/// semaphore, is sent only after this device's `ready` for `h`. So the semaphores do not
/// grow with the axis (one per source and array used more of a chip's semaphore memory than
/// 16 devices allow).
struct Exchange<'a, M: MeshShape> {
    devices: &'a Devices<M>,
    /// This device's position along the axis, and the axis' size.
    me: Value,
    n: usize,
    heads_here: usize,
    rows: usize,
    send: &'a DmaSem,
    recv: &'a DmaSem,
}

/// What [`Exchange::step`] asks of each group of arrays: start a head's copies, or wait
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transfer {
    Start,
    Wait,
}

impl<'a, M: MeshShape> Exchange<'a, M> {
    /// The exchange of `heads` heads of `rows` rows per device over axis `A`.
    fn new<A: MeshAxis>(
        devices: &'a Devices<M>,
        heads: usize,
        rows: usize,
        send: &'a DmaSem,
        recv: &'a DmaSem,
    ) -> Self
    where
        M: HasAxis<A>,
    {
        let n = devices.size::<A>();
        Exchange {
            devices,
            me: devices.index::<A>(),
            n,
            heads_here: heads / n,
            rows,
            send,
            recv,
        }
    }

    /// The position `k` along from this device, and `k` back.
    fn along(&self, k: usize) -> Value {
        (self.me + k as i32) % self.n as i32
    }

    fn back(&self, k: usize) -> Value {
        (self.me + (self.n - k) as i32) % self.n as i32
    }

    /// Local head `h` of the device at position `p`, as a window of an `[H, ..]` array of
    /// `rank` dims.
    fn head(&self, p: Value, h: Value, rank: usize) -> Vec<Idx> {
        let mut window = vec![ds(p * self.heads_here as i32 + h, 1)];
        window.resize_with(rank, all);
        window
    }

    /// Slot `s` (device `s`'s rows) of buffer `b` of a gathered head of `rank` dims.
    fn slot(&self, b: Value, s: Value, rank: usize) -> Vec<Idx> {
        let mut window = vec![ds(b, 1), ds(s * self.rows as i32, self.rows)];
        window.resize_with(rank, all);
        window
    }

    /// Starts or waits ([`Transfer`]) head `h` of `arrays` into buffer `b` of `gathered`.
    fn transfer<T: Element, A: MeshAxis>(
        &self,
        t: Transfer,
        arrays: &[&Hbm<T>],
        gathered: &mut [&mut impl Landing<T>],
        h: Value,
        b: Value,
    ) where
        M: HasAxis<A>,
    {
        match t {
            Transfer::Start => self.start::<T, A>(arrays, gathered, h, b),
            Transfer::Wait => self.wait(arrays, gathered, h, b),
        }
    }

    /// Starts sending local head `h` of every array's owner there, into buffer `b`: to the
    /// device `k` along, its head (that device's local head `h`) into slot `me`.
    fn start<T: Element, A: MeshAxis>(
        &self,
        arrays: &[&Hbm<T>],
        gathered: &mut [&mut impl Landing<T>],
        h: Value,
        b: Value,
    ) where
        M: HasAxis<A>,
    {
        for (x, g) in arrays.iter().zip(gathered.iter_mut()) {
            let rank = x.shape().len();
            let landed = || self.recv.at(b);
            let mine = self.slot(b, self.me, rank);
            let own = x.at(&self.head(self.me, h, rank));
            async_copy(own, g.landing(&mine), landed()).detach();
            for k in 1..self.n {
                let to = self.along(k);
                let src = x.at(&self.head(to, h, rank));
                let sent = self.send.at(b);
                let to = self.devices.shifted::<A>(k as i64);
                remote_copy(src, g.landing(&mine), sent, landed(), to).detach();
            }
        }
    }

    /// Waits what [`Exchange::start`] started: this device's sends and every source's rows.
    fn wait<T: Element>(
        &self,
        arrays: &[&Hbm<T>],
        gathered: &mut [&mut impl Landing<T>],
        h: Value,
        b: Value,
    ) {
        for (x, g) in arrays.iter().zip(gathered.iter_mut()) {
            let rank = x.shape().len();
            let own = || x.at(&self.head(self.me, h, rank));
            let mine = self.slot(b, self.me, rank);
            wait_copy(own(), g.landing(&mine), self.recv.at(b));
            for k in 1..self.n {
                let (to, from) = (self.along(k), self.back(k));
                let src = x.at(&self.head(to, h, rank));
                wait_copy(src, g.landing(&mine), self.send.at(b));
                let arriving = g.landing(&self.slot(b, from, rank));
                wait_copy(own(), arriving, self.recv.at(b));
            }
        }
    }

    /// Every owner's head `h` into buffer `h % 2`, for every group of arrays `transfer`
    /// starts and waits: at the first step this device meets the others and starts head 0;
    /// at each step it waits head `h` and starts head `h + 1` into the other buffer once
    /// every owner has signalled `ready` for it (that owner is done with head `h - 1`,
    /// which used that buffer; see [`Exchange::done`]).
    fn step<A: MeshAxis>(
        &self,
        ready: &Sem,
        h: Value,
        mut transfer: impl FnMut(Transfer, Value, Value),
    ) where
        M: HasAxis<A>,
    {
        when(h.eq(0), || {
            if self.n > 1 {
                meet_all::<M, A>(self.devices);
            }
            transfer(Transfer::Start, h, h % 2);
        });
        transfer(Transfer::Wait, h, h % 2);
        let last = self.heads_here as i32 - 1;
        when(h.lt(last), || {
            when(h.ge(1), || {
                for k in 1..self.n {
                    ready.at(self.along(k)).wait(1);
                }
            });
            // `h + 1` where it runs; the `minimum` proves every head window in range when
            // the kernel is instantiated, so no run-time index check is needed.
            let next = (h + 1).minimum(last);
            transfer(Transfer::Start, next, next % 2);
        });
    }

    /// [`Exchange::step`] over a kernel's two groups of arrays: `rows` (the arrays whose
    /// heads' rows this exchange moves, and their landing buffers) and `per_block` (f32
    /// arrays of one row per block, such as segment ids or the backward's residuals, with
    /// their exchange of `rows / block` rows, their arrays and their VMEM buffers).
    #[allow(clippy::type_complexity)]
    fn step_all<T: Element, A: MeshAxis>(
        &self,
        ready: &Sem,
        h: Value,
        (arrays, gathered): (&[&Hbm<T>], &mut [&mut impl Landing<T>]),
        (blocks, small, small_g): (&Exchange<'_, M>, &[&Hbm<f32>], &mut [&mut Vmem<f32>]),
    ) where
        M: HasAxis<A>,
    {
        self.step::<A>(ready, h, |t, h, b| {
            self.transfer::<T, A>(t, arrays, gathered, h, b);
            if !small.is_empty() {
                blocks.transfer::<f32, A>(t, small, small_g, h, b);
            }
        });
    }

    /// This device is done with head `h`'s buffer: the owners may send head `h + 2` into it.
    fn done<A: MeshAxis>(&self, ready: &Sem, h: Value)
    where
        M: HasAxis<A>,
    {
        when((h + 2).lt(self.heads_here as i32), || {
            for k in 1..self.n {
                ready
                    .at(self.me)
                    .signal_to(1, self.devices.shifted::<A>(k as i64));
            }
        });
    }
}

/// Ulysses attention's forward over the axis `A` of `N` devices, fused: `q`, `k`, `v` are
/// this device's sequence shard of every head (`[H, SL, D]` in HBM, the whole sequence `S =
/// N SL` in axis order), `out` the same for the output: `softmax(scale q k^T) v` per head
/// over the whole sequence, each query attending the keys it sees by `visible` (positions
/// in the whole sequence), `scale = 1 / sqrt(D)` by default (`logits`). Device `d` attends
/// its `HL = H / N` heads `d HL .. (d + 1) HL`, one per grid step:
///
/// - the step before (the first step for head 0) has started the exchange of the head's
///   rows: every device copies its `SL` rows of that head of q, k and v into slot `me` of a
///   `[2, S, D]` VMEM buffer of the head's owner (double-buffered, so the next head's
///   exchange runs during this head's attention), on one receive semaphore per buffer
///   (see `Exchange`: the kernel's semaphores do not grow with the axis but for `ready`);
/// - it waits the head's rows, starts the next head's exchange (once every owner has
///   signalled that it finished the head that used that buffer), and computes the head
///   chunk by chunk of `SL` query rows, in the order `me, me + 1, ...`, with an online
///   softmax over blocks of `block` keys;
/// - each finished chunk is copied at once to the device whose rows it holds (its head's
///   rows of `out` there), while the next chunk is computed.
///
/// `segment_ids` (optional, `def.without("segment_ids")` leaves them out): this device's
/// rows' segment ids per head, f32 (exact below 2^24) `[H, SL / block, 1, block]`, exchanged
/// beside q, k and v; a query then attends only the keys of its own segment (packed
/// sequences). The backward takes them the same way.
///
/// `lse` (optional, `def.without("lse")` leaves it out): the rows' logsumexp, f32, sent
/// back beside `out` (as the custom-VJP forward of the `ulysses_fused` strategy needs it).
/// Its layout `[H, SL / block, 1, block]` keeps a block's rows lanes-wide (row-major it is
/// `[H, SL]`), which Mosaic copies where a `[.., 1]` column is refused.
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
    #[shape(H, SL / block, 1, block)] segment_ids: Option<Hbm<f32>>,
    #[shape(H, SL, D)] mut out: HbmMut<T>,
    #[shape(H, SL / block, 1, block)] mut lse: Option<HbmMut<f32>>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut qg: Vmem<T>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut kg: Vmem<T>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut vg: Vmem<T>,
    #[scratch(devices.size::<A>() * SL, D)] mut og: Vmem<T>,
    #[scratch(devices.size::<A>() * SL / block, 1, block)] mut lg: Vmem<f32>,
    #[scratch(2, devices.size::<A>() * SL / block, 1, block)] mut segments: Vmem<f32>,
    #[scratch(2)] send: DmaSem,
    #[scratch(2)] recv: DmaSem,
    out_send: DmaSem,
    out_recv: DmaSem,
    out_local: DmaSem,
    #[scratch(devices.size::<A>())] ready: Sem,
    devices: Devices<M>,
    #[comptime] block: usize,
    #[comptime] visible: Visibility,
    #[comptime] logits: Logits,
) {
    let hl = program_id(0);
    let x = Exchange::new::<A>(&devices, H, SL, &send, &recv);
    let (mut ids, mut ids_g) = (vec![], vec![]);
    if let Some(segment_ids) = &segment_ids {
        ids.push(segment_ids);
        ids_g.push(&mut segments);
    }
    let ids_x = Exchange::new::<A>(&devices, H, SL / block, &send, &recv);
    let rows = (&[&q, &k, &v][..], &mut [&mut qg, &mut kg, &mut vg][..]);
    x.step_all::<T, A>(&ready, hl, rows, (&ids_x, &ids, &mut ids_g));
    let b = hl % 2;
    let segments = segment_ids.as_ref().map(|_| (&segments, b));
    let back = SendBack {
        out: &mut out,
        lse: lse.as_mut(),
        og: &mut og,
        lg: &mut lg,
        sems: [&out_send, &out_recv, &out_local],
    };
    back.attend_head::<A, M>(&x, &devices, hl, block, |row| {
        attend_rows(
            &qg,
            &kg,
            &vg,
            segments,
            (b, row.row0, block),
            visible,
            logits,
        )
    });
    x.done::<A>(&ready, hl);
}

/// [`ulysses_attention_of`] with the gathered heads staged in HBM instead of VMEM, for
/// sequences whose heads do not fit VMEM (at blocks 512, bf16 and D = 128, the forward
/// stages 48 MiB of q, k and v per 32K tokens in VMEM): the exchange lands each head's rows
/// in the outputs `qg`, `kg`, `vg` (`[2, S, D]`, the two heads in flight; the caller drops
/// them), and the attention fetches them into VMEM block by block, nothing waited that was
/// not started one block earlier: a query block's queries and first key and value blocks
/// while the query block before it is attended (the first before the loop), each later key
/// and value block while the one before it is. The output chunks and lse are gathered in
/// VMEM and sent back as the VMEM kernel does. Same arguments, outputs (but the three
/// staging ones last) and results.
#[tpu_kernel(
    grid = (H / devices.size::<A>(),),
    name = "ulysses_attention_staged",
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
pub fn ulysses_attention_staged_of<T: Element, M: MeshShape + HasAxis<A>, A: MeshAxis>(
    #[shape(H, SL, D)] q: Hbm<T>,
    #[shape(H, SL, D)] k: Hbm<T>,
    #[shape(H, SL, D)] v: Hbm<T>,
    #[shape(H, SL / block, 1, block)] segment_ids: Option<Hbm<f32>>,
    #[shape(H, SL, D)] mut out: HbmMut<T>,
    #[shape(H, SL / block, 1, block)] mut lse: Option<HbmMut<f32>>,
    #[shape(2, devices.size::<A>() * SL, D)] mut qg: HbmMut<T>,
    #[shape(2, devices.size::<A>() * SL, D)] mut kg: HbmMut<T>,
    #[shape(2, devices.size::<A>() * SL, D)] mut vg: HbmMut<T>,
    #[scratch(2, block, D)] mut q_blocks: Vmem<T>,
    #[scratch(4, block, D)] mut k_blocks: Vmem<T>,
    #[scratch(4, block, D)] mut v_blocks: Vmem<T>,
    #[scratch(devices.size::<A>() * SL, D)] mut og: Vmem<T>,
    #[scratch(devices.size::<A>() * SL / block, 1, block)] mut lg: Vmem<f32>,
    #[scratch(2, devices.size::<A>() * SL / block, 1, block)] mut segments: Vmem<f32>,
    #[scratch(2)] send: DmaSem,
    #[scratch(2)] recv: DmaSem,
    out_send: DmaSem,
    out_recv: DmaSem,
    out_local: DmaSem,
    #[scratch(6)] fetch: DmaSem,
    #[scratch(devices.size::<A>())] ready: Sem,
    devices: Devices<M>,
    #[comptime] block: usize,
    #[comptime] visible: Visibility,
    #[comptime] logits: Logits,
) {
    let hl = program_id(0);
    let x = Exchange::new::<A>(&devices, H, SL, &send, &recv);
    let (mut ids, mut ids_g) = (vec![], vec![]);
    if let Some(segment_ids) = &segment_ids {
        ids.push(segment_ids);
        ids_g.push(&mut segments);
    }
    let ids_x = Exchange::new::<A>(&devices, H, SL / block, &send, &recv);
    let rows = (&[&q, &k, &v][..], &mut [&mut qg, &mut kg, &mut vg][..]);
    x.step_all::<T, A>(&ready, hl, rows, (&ids_x, &ids, &mut ids_g));
    let b = hl % 2;
    let segments = segment_ids.as_ref().map(|_| (&segments, b));
    let back = SendBack {
        out: &mut out,
        lse: lse.as_mut(),
        og: &mut og,
        lg: &mut lg,
        sems: [&out_send, &out_recv, &out_local],
    };
    let staged = Staged {
        q: &qg,
        k: &kg,
        v: &vg,
        fetch: &fetch,
        b,
        block,
    };
    // The first query block (chunk `me`'s first), then each the one after it.
    let slots = [&mut q_blocks, &mut k_blocks, &mut v_blocks];
    staged.start_row(slots, 0.into_index(), x.me * SL as i32, visible);
    back.attend_head::<A, M>(&x, &devices, hl, block, |row| {
        let slots = [&mut q_blocks, &mut k_blocks, &mut v_blocks];
        staged.attend_rows(slots, segments, row, visible, logits)
    });
    x.done::<A>(&ready, hl);
}

/// A query block of the forward's head: its first row, its place in the order the head's
/// blocks are attended (chunk `me` first), and the next block's first row with whether
/// there is one (`None`: always; else a run-time condition).
#[derive(Debug, Clone, Copy)]
struct Row {
    row0: Value,
    index: Value,
    next: (Value, Option<Value>),
}

/// Where the forward gathers a head's output rows (and their lse) before sending each
/// chunk back to the device it belongs to, and the semaphores of those copies: `[send,
/// receive, local]`.
struct SendBack<'a, T: Element> {
    out: &'a mut HbmMut<T>,
    lse: Option<&'a mut HbmMut<f32>>,
    og: &'a mut Vmem<T>,
    lg: &'a mut Vmem<f32>,
    sems: [&'a DmaSem; 3],
}

impl<T: Element> SendBack<'_, T> {
    /// The head `hl`'s attention, one chunk of `SL` query rows at a time (chunk `s` holds
    /// device `s`'s rows) in blocks of `block` rows (`attend(row)`: the unnormalised output,
    /// running max and sum of the query block `row`), each chunk sent to its device as soon
    /// as it is done (with its rows' lse when the kernel writes it); then the sends and every
    /// owner's chunk of this device's rows waited.
    fn attend_head<A: MeshAxis, M: HasAxis<A>>(
        mut self,
        x: &Exchange<'_, M>,
        devices: &Devices<M>,
        hl: Value,
        block: usize,
        mut attend: impl FnMut(Row) -> (Value, Value, Value),
    ) {
        let [out_send, out_recv, out_local] = self.sems;
        let (sl, per_chunk) = (x.rows, (x.rows / block) as i32);
        for k in 0..x.n {
            let s = x.along(k);
            // The first row of the next chunk (of this one where there is none).
            let next_chunk = x.along((k + 1) % x.n) * sl as i32;
            fori_loop(0, per_chunk, (), |i, ()| {
                let row0 = s * sl as i32 + i * block as i32;
                let in_chunk = (i + 1).lt(per_chunk);
                let row = Row {
                    row0,
                    index: i + k as i32 * per_chunk,
                    next: (
                        select(in_chunk, row0 + block as i32, next_chunk),
                        (k + 1 == x.n).then_some(in_chunk),
                    ),
                };
                let (acc, m, l) = attend(row);
                self.og
                    .at_mut(&[ds(row0, block), all()])
                    .store((acc / l).cast(T::DTYPE));
                if self.lse.is_some() {
                    let lse_row = lane_row(m + l.log(), block).reshape(&[1, 1, block]);
                    self.lg
                        .at_mut(&[ds(row0 / block as i32, 1), all(), all()])
                        .store(lse_row);
                }
            });
            // Chunk `s` to device `s` (the device `k` along), as its rows of head `me HL +
            // hl`.
            let chunk = [ds(s * sl as i32, sl), all()];
            let lse_chunk = lse_rows(s, sl, block);
            let (dst, lse_dst) = (x.head(x.me, hl, 3), x.head(x.me, hl, 4));
            // The chunks, the lse's too, share their semaphores, as the exchange's arrays
            // do. This device's own chunk has one of its own: other devices' chunks of their
            // next head may land on `out_recv` before it, and `og` is overwritten then.
            if k == 0 {
                async_copy(self.og.at(&chunk), self.out.at_mut(&dst), out_local).wait();
                if let Some(lse) = self.lse.as_mut() {
                    async_copy(self.lg.at(&lse_chunk), lse.at_mut(&lse_dst), out_local).wait();
                }
            } else {
                let to = devices.shifted::<A>(k as i64);
                let (src, dst) = (self.og.at(&chunk), self.out.at_mut(&dst));
                remote_copy(src, dst, out_send, out_recv, to).detach();
                if let Some(lse) = self.lse.as_mut() {
                    let (src, dst) = (self.lg.at(&lse_chunk), lse.at_mut(&lse_dst));
                    remote_copy(src, dst, out_send, out_recv, to).detach();
                }
            }
        }
        // This step's chunks: sent, and every owner's chunk of this device's rows arrived
        // (head `from HL + hl` from the device `k` back).
        for k in 1..x.n {
            let (to, from) = (x.along(k), x.back(k));
            let theirs = [ds(to * sl as i32, sl), all()];
            let mine = [ds(x.me * sl as i32, sl), all()];
            let (at_me, at_from) = (x.head(x.me, hl, 3), x.head(from, hl, 3));
            wait_copy(self.og.at(&theirs), self.out.at_mut(&at_me), out_send);
            wait_copy(self.og.at(&mine), self.out.at_mut(&at_from), out_recv);
            if let Some(lse) = self.lse.as_mut() {
                let (theirs, mine) = (lse_rows(to, sl, block), lse_rows(x.me, sl, block));
                let (at_me, at_from) = (x.head(x.me, hl, 4), x.head(from, hl, 4));
                wait_copy(self.lg.at(&theirs), lse.at_mut(&at_me), out_send);
                wait_copy(self.lg.at(&mine), lse.at_mut(&at_from), out_recv);
            }
        }
    }
}

/// Query rows `row0 .. row0 + block` of the gathered head in buffer `b` attended over its
/// keys (the key blocks holding a key one of its rows sees by `visible`) with an online
/// softmax over blocks of `block` keys: the unnormalised output `[block, D]`, the running
/// max and sum `[block, 1]` (f32; `out = acc / l`, `lse = m + log l`).
#[allow(clippy::too_many_arguments)]
fn attend_rows<T: Element>(
    qg: &Vmem<T>,
    kg: &Vmem<T>,
    vg: &Vmem<T>,
    segments: Option<(&Vmem<f32>, Value)>,
    (b, row0, block): (Value, Value, usize),
    visible: Visibility,
    logits: Logits,
) -> (Value, Value, Value) {
    let [_, s, d] = <[usize; 3]>::try_from(qg.shape()).expect("a [2, S, D] buffer");
    let rows = [ds(b, 1), ds(row0, block), all()];
    let qi = scaled_queries::<T>(qg.at(&rows).load().reshape(&[block, d]), logits.scale(d));
    let rows = QueryRows::new(qi, row0, block, segments, visible, logits);
    let (first, end) = visible.key_blocks(row0, s, block);
    fori_loop(first, end, rows.init(), |j, carry| {
        let keys = [ds(b, 1), ds(j * block as i32, block), all()];
        let kj = kg.at(&keys).load().reshape(&[block, d]);
        let vj = vg.at(&keys).load().reshape(&[block, d]);
        rows.step::<T>(carry, j, kj, vj)
    })
}

/// A query block of the forward and what its online softmax needs at every key block.
struct QueryRows<'a> {
    /// The block's queries, scaled, `[block, D]`.
    qi: Value,
    row0: Value,
    block: usize,
    segments: Option<(&'a Vmem<f32>, Value)>,
    /// The block's segment ids as a column, taken once rather than at every key block.
    q_ids: Option<Value>,
    visible: Visibility,
    logits: Logits,
}

impl<'a> QueryRows<'a> {
    fn new(
        qi: Value,
        row0: Value,
        block: usize,
        segments: Option<(&'a Vmem<f32>, Value)>,
        visible: Visibility,
        logits: Logits,
    ) -> Self {
        let q_ids = query_segments(segments, row0 / block as i32, block);
        QueryRows {
            qi,
            row0,
            block,
            segments,
            q_ids,
            visible,
            logits,
        }
    }

    /// The running `(unnormalised output, max, sum)` before the first key block.
    fn init(&self) -> (Value, Value, Value) {
        let (block, d) = (self.block, self.qi.shape()[1]);
        (
            constant(DType::F32, &[block, d], 0.0),
            constant(DType::F32, &[block, 1], f32::NEG_INFINITY),
            constant(DType::F32, &[block, 1], 0.0),
        )
    }

    /// The online softmax past key block `j` (`kj`, `vj`: its keys and values `[block, D]`).
    fn step<T: Element>(
        &self,
        (acc, m, l): (Value, Value, Value),
        j: Value,
        kj: Value,
        vj: Value,
    ) -> (Value, Value, Value) {
        let block = self.block;
        let s_ij = self.logits.of(dot_nt(self.qi, kj));
        let s_ij = self
            .visible
            .masked(s_ij, self.row0, j * block as i32, block);
        let s_ij = segment_masked(s_ij, self.segments, self.q_ids, j, block);
        let m_new = m.maximum(s_ij.max_keepdims(-1));
        let alpha = (m - m_new).exp();
        let p = (s_ij - m_new).exp();
        let l_new = alpha * l + p.sum_keepdims(-1);
        let acc_new = acc * alpha + dot(p.cast(T::DTYPE), vj);
        (acc_new, m_new, l_new)
    }
}

/// A gathered head staged in HBM (`q`, `k`, `v`: `[2, S, D]`, the head in buffer `b`) and
/// the DMA semaphores its blocks are fetched into VMEM on. Blocks land in slots of
/// `[slots, block, D]` VMEM buffers, fetched ahead of the products that read them: a group
/// of arrays fetched together (the forward's query block; the backward's key and value
/// blocks) has two slots, one per parity of the row (key block) they serve, on
/// `fetch.at(0..2)`; the blocks a loop runs over (the forward's keys and values; the
/// backward's queries and output cotangents) have four, `2 p + j % 2` for block `j` of a
/// loop of parity `p`, on `fetch.at(2..6)`. So the next loop's first blocks are fetched
/// while this loop runs, into slots this loop does not touch.
struct Staged<'a, T: Element> {
    q: &'a HbmMut<T>,
    k: &'a HbmMut<T>,
    v: &'a HbmMut<T>,
    fetch: &'a DmaSem,
    b: Value,
    block: usize,
}

/// The first DMA semaphore (of `fetch`) of the slots a loop runs over; below it, the two of
/// the blocks fetched once per loop.
const LOOP_SLOTS_SEM: i32 = 2;

impl<T: Element> Staged<'_, T> {
    /// Rows `row0 .. row0 + block` of the head, as a window of a `[2, S, D]` buffer.
    fn rows(&self, row0: Value) -> [Idx; 3] {
        [ds(self.b, 1), ds(row0, self.block), all()]
    }

    /// The last block of the head.
    fn last(&self) -> i32 {
        (self.q.shape()[1] / self.block) as i32 - 1
    }

    /// The copies of block `j` of each of `arrays` into slot `slot` of its `slots`, on
    /// `fetch.at(sem)`.
    fn copies(
        &self,
        arrays: &[&HbmMut<T>],
        slots: &mut [&mut Vmem<T>],
        (slot, sem): (Value, Value),
        j: Value,
    ) -> Vec<CopyDescriptor> {
        let from = self.rows(j * self.block as i32);
        let to = [ds(slot, 1), all(), all()];
        arrays
            .iter()
            .zip(slots.iter_mut())
            .map(|(x, s)| make_async_copy(x.at(&from), s.at_mut(&to), self.fetch.at(sem)))
            .collect()
    }

    /// Slot `slot` of `slots` as a `[block, D]` value.
    fn load(slots: &Vmem<T>, slot: Value) -> Value {
        let [_, block, d] = <[usize; 3]>::try_from(slots.shape()).expect("[slots, block, D]");
        slots
            .at(&[ds(slot, 1), all(), all()])
            .load()
            .reshape(&[block, d])
    }

    /// The slot (and semaphore) of block `j` of a loop of parity `p`.
    fn loop_slot(p: Value, j: Value) -> (Value, Value) {
        let slot = p * 2 + j % 2;
        (slot, slot + LOOP_SLOTS_SEM)
    }

    /// `f(carry, j, x_j, y_j)` over blocks `first .. end` (a loop of parity `p`) of the pair
    /// `arrays` (`[block, D]` each), block `first` fetched already ([`Staged::copies`] into
    /// [`Staged::loop_slot`]`(p, first)`) and each later one fetched while the block before
    /// it is worked on.
    fn fold_pairs<C: Carry>(
        &self,
        arrays: [&HbmMut<T>; 2],
        [x_slots, y_slots]: [&mut Vmem<T>; 2],
        p: Value,
        (first, end): (Value, Value),
        init: C,
        mut f: impl FnMut(C, Value, Value, Value) -> C,
    ) -> C {
        fori_loop(first, end, init, |j, carry| {
            // `j + 1` where it runs; the `minimum` proves the window in range.
            when((j + 1).lt(end), || {
                let next = (j + 1).minimum(self.last());
                let slot = Self::loop_slot(p, next);
                for c in self.copies(&arrays, &mut [x_slots, y_slots], slot, next) {
                    c.start();
                }
            });
            let slot = Self::loop_slot(p, j);
            for c in self.copies(&arrays, &mut [x_slots, y_slots], slot, j) {
                c.wait();
            }
            let (xj, yj) = (Self::load(x_slots, slot.0), Self::load(y_slots, slot.0));
            f(carry, j, xj, yj)
        })
    }

    /// Starts fetching what query block row `row0` of parity `p` needs first: its queries
    /// (slot `p` of `q_blocks`) and its first key and value blocks by `visible`.
    fn start_row(
        &self,
        [q_blocks, k_blocks, v_blocks]: [&mut Vmem<T>; 3],
        p: Value,
        row0: Value,
        visible: Visibility,
    ) {
        // The row is in range where this runs; the `minimum` proves it.
        let i = (row0 / self.block as i32).minimum(self.last());
        let mut copies = self.copies(&[self.q], &mut [q_blocks], (p, p), i);
        let (first, _) = visible.key_blocks(row0, self.q.shape()[1], self.block);
        let first = first.minimum(self.last());
        let kv = (&[self.k, self.v][..], &mut [k_blocks, v_blocks][..]);
        copies.extend(self.copies(kv.0, kv.1, Self::loop_slot(p, first), first));
        for c in copies {
            c.start();
        }
    }

    /// [`attend_rows`] over the staged head for query block `row`, whose queries and first
    /// key and value blocks [`Staged::start_row`] has started; it starts the next row's
    /// first (if any) before its own products.
    fn attend_rows(
        &self,
        [q_blocks, k_blocks, v_blocks]: [&mut Vmem<T>; 3],
        segments: Option<(&Vmem<f32>, Value)>,
        row: Row,
        visible: Visibility,
        logits: Logits,
    ) -> (Value, Value, Value) {
        let (block, s, d) = (self.block, self.q.shape()[1], self.q.shape()[2]);
        let p = row.index % 2;
        let (next_row0, has_next) = row.next;
        let mut start_next = || {
            let slots = [&mut *q_blocks, &mut *k_blocks, &mut *v_blocks];
            self.start_row(slots, 1 - p, next_row0, visible)
        };
        match has_next {
            Some(cond) => when(cond, start_next),
            None => start_next(),
        }
        let i = row.row0 / block as i32;
        for c in self.copies(&[self.q], &mut [q_blocks], (p, p), i) {
            c.wait();
        }
        let qi = scaled_queries::<T>(Self::load(q_blocks, p), logits.scale(d));
        let rows = QueryRows::new(qi, row.row0, block, segments, visible, logits);
        let keys = visible.key_blocks(row.row0, s, block);
        let slots = [k_blocks, v_blocks];
        self.fold_pairs(
            [self.k, self.v],
            slots,
            p,
            keys,
            rows.init(),
            |carry, j, kj, vj| rows.step::<T>(carry, j, kj, vj),
        )
    }

    /// Starts fetching what key block `j` of the backward needs first: its keys and values
    /// (slot `j % 2`) and the q and dout of the first query block that sees it (of `q` and
    /// `dout`, the staged queries and output cotangents).
    fn start_key_block(
        &self,
        [k_blocks, v_blocks]: [&mut Vmem<T>; 2],
        (dout, q_slots, do_slots): (&HbmMut<T>, &mut Vmem<T>, &mut Vmem<T>),
        j: Value,
        visible: Visibility,
    ) {
        let p = j % 2;
        let kv = (&[self.k, self.v][..], &mut [k_blocks, v_blocks][..]);
        let mut copies = self.copies(kv.0, kv.1, (p, p), j);
        let (first, _) = visible.query_blocks(j, self.q.shape()[1], self.block);
        let first = first.minimum(self.last());
        let qdo = (&[self.q, dout][..], &mut [q_slots, do_slots][..]);
        copies.extend(self.copies(qdo.0, qdo.1, Self::loop_slot(p, first), first));
        for c in copies {
            c.start();
        }
    }
}

/// A column `[block, 1]` as a row `[1, block]` (the lse stored lanes-wide): masked onto the
/// diagonal and summed down the sublanes, which Mosaic lowers where a transpose of one
/// column does not.
fn lane_row(column: Value, block: usize) -> Value {
    (diagonal(block) * column).sum_keepdims(0)
}

/// A row `[1, block]` as a column `[block, 1]`, as [`lane_row`] does the other way.
fn lane_column(row: Value, block: usize) -> Value {
    (diagonal(block) * row).sum_keepdims(1)
}

/// The `[block, block]` identity, f32.
fn diagonal(block: usize) -> Value {
    let (rows, cols) = (
        iota(DType::I32, &[block, block], 0),
        iota(DType::I32, &[block, block], 1),
    );
    select(rows.eq(cols), 1.0f32, 0.0f32)
}

/// Rows `s SL .. (s + 1) SL` of the gathered lse (`[S / block, 1, block]`, a block's rows
/// lanes-wide).
fn lse_rows(s: Value, rows: usize, block: usize) -> [Idx; 3] {
    [ds(s * (rows / block) as i32, rows / block), all(), all()]
}

/// `scale q` in the input dtype (the logits' scale, applied once per query block).
fn scaled_queries<T: Element>(q: Value, scale: f32) -> Value {
    (q.cast(DType::F32) * scale).cast(T::DTYPE)
}

/// Block `i`'s segment ids `[1, block]` (lanes-wide) in buffer `b` of the gathered head's
/// ids (f32, exact below 2^24; `[2, S / block, 1, block]`).
fn segment_row(ids: &Vmem<f32>, b: Value, i: Value, block: usize) -> Value {
    ids.at(&[ds(b, 1), ds(i, 1), all(), all()])
        .load()
        .reshape(&[1, block])
}

/// `logits` `[block, block]` of a query block whose segment ids are `q_ids` (a column
/// `[block, 1]`) and key block `kj`, [`MASKED`] where their segment ids differ
/// (packed sequences; unchanged without segment ids). `segments`: the gathered head's ids
/// and the buffer that holds them.
fn segment_masked(
    logits: Value,
    segments: Option<(&Vmem<f32>, Value)>,
    q_ids: Option<Value>,
    kj: Value,
    block: usize,
) -> Value {
    let (Some((ids, b)), Some(q_ids)) = (segments, q_ids) else {
        return logits;
    };
    select(q_ids.eq(segment_row(ids, b, kj, block)), logits, MASKED)
}

/// Query block `qi`'s segment ids as a column `[block, 1]`, where there are segment ids.
fn query_segments(segments: Option<(&Vmem<f32>, Value)>, qi: Value, block: usize) -> Option<Value> {
    segments.map(|(ids, b)| lane_column(segment_row(ids, b, qi, block), block))
}

/// The logit of a key a query does not see (by position or segment): finite, as splash's
/// mask value, so that a block whose keys a row sees none of (a local window's first block,
/// a later document's first blocks) keeps a finite running max (`-inf - -inf` would be
/// NaN); a later visible key's logit then outweighs it by `exp(MASKED - logit) = 0`. Every
/// query sees itself, so no row is left with masked keys only.
const MASKED: f32 = -0.7 * f32::MAX;

/// The backward of [`ulysses_attention_of`], fused the same way: from this device's rows of
/// `q`, `k`, `v`, the output's cotangent `dout` (`[H, SL, D]` each) and of the forward's
/// residuals `lse` and `di = rowsum(out * dout)` (f32, `[H, SL / block, 1, block]` as the
/// forward writes `lse`), its rows of `dq`, `dk`, `dv`. Each grid step takes one of this
/// device's heads: the six arrays' rows of it arrive as in the forward (the next head's
/// during this one's work), then per key block `dk`, `dv` and the `dq` of every query block
/// it meets (`ds = p (dp - di)`, `p = exp(logits - lse)`), and each gradient's chunks go back
/// to the devices whose rows they are. Every device computes `di` of its own rows before
/// the kernel (it holds their `out` and `dout`), so neither `out` nor the forward is needed
/// here.
#[tpu_kernel(
    grid = (H / devices.size::<A>(),),
    name = "ulysses_attention_bwd",
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
pub fn ulysses_attention_bwd_of<T: Element, M: MeshShape + HasAxis<A>, A: MeshAxis>(
    #[shape(H, SL, D)] q: Hbm<T>,
    #[shape(H, SL, D)] k: Hbm<T>,
    #[shape(H, SL, D)] v: Hbm<T>,
    #[shape(H, SL, D)] dout: Hbm<T>,
    #[shape(H, SL / block, 1, block)] lse: Hbm<f32>,
    #[shape(H, SL / block, 1, block)] di: Hbm<f32>,
    #[shape(H, SL / block, 1, block)] segment_ids: Option<Hbm<f32>>,
    #[shape(H, SL, D)] mut dq: HbmMut<T>,
    #[shape(H, SL, D)] mut dk: HbmMut<T>,
    #[shape(H, SL, D)] mut dv: HbmMut<T>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut qg: Vmem<T>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut kg: Vmem<T>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut vg: Vmem<T>,
    #[scratch(2, devices.size::<A>() * SL, D)] mut dog: Vmem<T>,
    #[scratch(2, devices.size::<A>() * SL / block, 1, block)] mut lse_g: Vmem<f32>,
    #[scratch(2, devices.size::<A>() * SL / block, 1, block)] mut di_g: Vmem<f32>,
    #[scratch(2, devices.size::<A>() * SL / block, 1, block)] mut segments: Vmem<f32>,
    #[scratch(devices.size::<A>() * SL, D)] mut dq_acc: Vmem<f32>,
    #[scratch(3, devices.size::<A>() * SL, D)] mut grads: Vmem<T>,
    #[scratch(2)] send: DmaSem,
    #[scratch(2)] recv: DmaSem,
    back_send: DmaSem,
    back_recv: DmaSem,
    back_local: DmaSem,
    #[scratch(devices.size::<A>())] ready: Sem,
    devices: Devices<M>,
    #[comptime] block: usize,
    #[comptime] visible: Visibility,
    #[comptime] logits: Logits,
) {
    let s_len = devices.size::<A>() * SL;
    let hl = program_id(0);
    let x = Exchange::new::<A>(&devices, H, SL, &send, &recv);
    let (mut stats, mut stats_g) = (vec![&lse, &di], vec![&mut lse_g, &mut di_g]);
    if let Some(segment_ids) = &segment_ids {
        stats.push(segment_ids);
        stats_g.push(&mut segments);
    }
    let stats_x = Exchange::new::<A>(&devices, H, SL / block, &send, &recv);
    let rows = (
        &[&q, &k, &v, &dout][..],
        &mut [&mut qg, &mut kg, &mut vg, &mut dog][..],
    );
    x.step_all::<T, A>(&ready, hl, rows, (&stats_x, &stats, &mut stats_g));
    let b = hl % 2;
    let head = HeadGrads {
        b,
        block,
        segments: segment_ids.as_ref().map(|_| (&segments, b)),
        lse: &lse_g,
        di: &di_g,
        visible,
        logits,
    };
    head.zero(&mut dq_acc, s_len);
    let rows = |i: Value| [ds(b, 1), ds(i * block as i32, block), all()];
    let load = |g: &Vmem<T>, i: Value| g.at(&rows(i)).load().reshape(&[block, D]);
    // Per key block: its dk, dv over the query blocks that see it, and their dq.
    fori_loop(0, (s_len / block) as i32, (), |j, ()| {
        let key = head.key_block(j, load(&kg, j), load(&vg, j));
        let queries = visible.query_blocks(j, s_len, block);
        let (dkj, dvj) = fori_loop(queries.0, queries.1, key.init(), |i, carry| {
            key.step::<T>(carry, i, load(&qg, i), load(&dog, i), &mut dq_acc)
        });
        head.store_key_grads::<T>(&mut grads, j, dkj, dvj);
    });
    head.store_dq::<T>(&dq_acc, &mut grads, s_len);
    let back = [&back_send, &back_recv, &back_local];
    send_grads_back::<T, A, M>(&x, &devices, hl, &grads, [&mut dq, &mut dk, &mut dv], back);
    x.done::<A>(&ready, hl);
}

/// [`ulysses_attention_bwd_of`] with the gathered heads staged in HBM instead of VMEM, for
/// sequences whose heads do not fit VMEM (at blocks 512, bf16 and D = 128, the backward
/// stages 64 MiB of q, k, v and dout per 32K tokens in VMEM): the exchange lands each
/// head's rows of the four in the outputs `qg`, `kg`, `vg`, `dog` (`[2, S, D]`; the caller
/// drops them), and the backward fetches them into VMEM block by block, each one block
/// ahead: a key block's k and v and its first query block's q and dout while the key block
/// before it is worked on, each later query block's while the one before it is. The
/// residuals (`lse`, `di`) and segment ids, the dq accumulator and the
/// gradients sent back stay in VMEM as in the VMEM kernel. Same arguments, outputs (but the
/// four staging ones last) and results.
#[tpu_kernel(
    grid = (H / devices.size::<A>(),),
    name = "ulysses_attention_bwd_staged",
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
pub fn ulysses_attention_bwd_staged_of<T: Element, M: MeshShape + HasAxis<A>, A: MeshAxis>(
    #[shape(H, SL, D)] q: Hbm<T>,
    #[shape(H, SL, D)] k: Hbm<T>,
    #[shape(H, SL, D)] v: Hbm<T>,
    #[shape(H, SL, D)] dout: Hbm<T>,
    #[shape(H, SL / block, 1, block)] lse: Hbm<f32>,
    #[shape(H, SL / block, 1, block)] di: Hbm<f32>,
    #[shape(H, SL / block, 1, block)] segment_ids: Option<Hbm<f32>>,
    #[shape(H, SL, D)] mut dq: HbmMut<T>,
    #[shape(H, SL, D)] mut dk: HbmMut<T>,
    #[shape(H, SL, D)] mut dv: HbmMut<T>,
    #[shape(2, devices.size::<A>() * SL, D)] mut qg: HbmMut<T>,
    #[shape(2, devices.size::<A>() * SL, D)] mut kg: HbmMut<T>,
    #[shape(2, devices.size::<A>() * SL, D)] mut vg: HbmMut<T>,
    #[shape(2, devices.size::<A>() * SL, D)] mut dog: HbmMut<T>,
    #[scratch(2, block, D)] mut k_blocks: Vmem<T>,
    #[scratch(2, block, D)] mut v_blocks: Vmem<T>,
    #[scratch(4, block, D)] mut q_blocks: Vmem<T>,
    #[scratch(4, block, D)] mut do_blocks: Vmem<T>,
    #[scratch(2, devices.size::<A>() * SL / block, 1, block)] mut lse_g: Vmem<f32>,
    #[scratch(2, devices.size::<A>() * SL / block, 1, block)] mut di_g: Vmem<f32>,
    #[scratch(2, devices.size::<A>() * SL / block, 1, block)] mut segments: Vmem<f32>,
    #[scratch(devices.size::<A>() * SL, D)] mut dq_acc: Vmem<f32>,
    #[scratch(3, devices.size::<A>() * SL, D)] mut grads: Vmem<T>,
    #[scratch(2)] send: DmaSem,
    #[scratch(2)] recv: DmaSem,
    back_send: DmaSem,
    back_recv: DmaSem,
    back_local: DmaSem,
    #[scratch(6)] fetch: DmaSem,
    #[scratch(devices.size::<A>())] ready: Sem,
    devices: Devices<M>,
    #[comptime] block: usize,
    #[comptime] visible: Visibility,
    #[comptime] logits: Logits,
) {
    let s_len = devices.size::<A>() * SL;
    let hl = program_id(0);
    let x = Exchange::new::<A>(&devices, H, SL, &send, &recv);
    let (mut stats, mut stats_g) = (vec![&lse, &di], vec![&mut lse_g, &mut di_g]);
    if let Some(segment_ids) = &segment_ids {
        stats.push(segment_ids);
        stats_g.push(&mut segments);
    }
    let stats_x = Exchange::new::<A>(&devices, H, SL / block, &send, &recv);
    let rows = (
        &[&q, &k, &v, &dout][..],
        &mut [&mut qg, &mut kg, &mut vg, &mut dog][..],
    );
    x.step_all::<T, A>(&ready, hl, rows, (&stats_x, &stats, &mut stats_g));
    let b = hl % 2;
    let head = HeadGrads {
        b,
        block,
        segments: segment_ids.as_ref().map(|_| (&segments, b)),
        lse: &lse_g,
        di: &di_g,
        visible,
        logits,
    };
    head.zero(&mut dq_acc, s_len);
    let staged = Staged {
        q: &qg,
        k: &kg,
        v: &vg,
        fetch: &fetch,
        b,
        block,
    };
    // Per key block: its dk, dv over the query blocks that see it, and their dq; the next
    // key block's first blocks fetched while this one is worked on.
    let blocks = (s_len / block) as i32;
    let (kv, qdo) = ([&kg, &vg], [&qg, &dog]);
    let firsts = |[k_blocks, v_blocks, q_blocks, do_blocks]: [&mut Vmem<T>; 4], j: Value| {
        let key_slots = [k_blocks, v_blocks];
        staged.start_key_block(key_slots, (&dog, q_blocks, do_blocks), j, visible)
    };
    let all_slots = [&mut k_blocks, &mut v_blocks, &mut q_blocks, &mut do_blocks];
    firsts(all_slots, 0.into_index());
    fori_loop(0, blocks, (), |j, ()| {
        let p = j % 2;
        when((j + 1).lt(blocks), || {
            let next = (j + 1).minimum(blocks - 1);
            let all_slots = [&mut k_blocks, &mut v_blocks, &mut q_blocks, &mut do_blocks];
            firsts(all_slots, next)
        });
        for c in staged.copies(&kv, &mut [&mut k_blocks, &mut v_blocks], (p, p), j) {
            c.wait();
        }
        let (kj, vj) = (Staged::load(&k_blocks, p), Staged::load(&v_blocks, p));
        let key = head.key_block(j, kj, vj);
        let queries = visible.query_blocks(j, s_len, block);
        let slots = [&mut q_blocks, &mut do_blocks];
        let (dkj, dvj) = staged.fold_pairs(qdo, slots, p, queries, key.init(), |c, i, qi, d_oi| {
            key.step::<T>(c, i, qi, d_oi, &mut dq_acc)
        });
        head.store_key_grads::<T>(&mut grads, j, dkj, dvj);
    });
    head.store_dq::<T>(&dq_acc, &mut grads, s_len);
    let back = [&back_send, &back_recv, &back_local];
    send_grads_back::<T, A, M>(&x, &devices, hl, &grads, [&mut dq, &mut dk, &mut dv], back);
    x.done::<A>(&ready, hl);
}

/// A gathered head's backward: its buffer `b`, the block size, its segment ids (if any) and
/// residuals `lse` and `di` (`[2, S / block, 1, block]`, gathered in VMEM), and its mask and
/// logits.
struct HeadGrads<'a> {
    b: Value,
    block: usize,
    segments: Option<(&'a Vmem<f32>, Value)>,
    lse: &'a Vmem<f32>,
    di: &'a Vmem<f32>,
    visible: Visibility,
    logits: Logits,
}

impl<'a> HeadGrads<'a> {
    /// Rows `i block ..` of a `[S, D]` buffer.
    fn flat(&self, i: Value) -> [Idx; 2] {
        [ds(i * self.block as i32, self.block), all()]
    }

    /// The dq accumulator (`[S, D]` f32) zeroed.
    fn zero(&self, dq_acc: &mut Vmem<f32>, s_len: usize) {
        let d = dq_acc.shape()[1];
        fori_loop(0, (s_len / self.block) as i32, (), |i, ()| {
            dq_acc
                .at_mut(&self.flat(i))
                .store(constant(DType::F32, &[self.block, d], 0.0));
        });
    }

    /// Query block `i`'s lse or di (`stats`) as a column `[block, 1]`.
    fn column(&self, stats: &Vmem<f32>, i: Value) -> Value {
        let row = stats.at(&[ds(self.b, 1), ds(i, 1), all(), all()]).load();
        lane_column(row.reshape(&[1, self.block]), self.block)
    }

    /// Key block `j` (its keys and values `[block, D]`), whose dk and dv the query blocks
    /// seeing it add to.
    fn key_block(&'a self, j: Value, kj: Value, vj: Value) -> KeyBlock<'a> {
        KeyBlock {
            head: self,
            j,
            kj,
            vj,
            scale: self.logits.scale(kj.shape()[1]),
        }
    }

    /// Key block `j`'s `dk`, `dv` (`[block, D]` f32) into gradients 1 and 2 of `grads`
    /// (`[3, S, D]`).
    fn store_key_grads<T: Element>(&self, grads: &mut Vmem<T>, j: Value, dkj: Value, dvj: Value) {
        let block = self.block;
        for (g, x) in [(1, dkj), (2, dvj)] {
            let d = x.shape()[1];
            grads
                .at_mut(&[ds(g, 1), ds(j * block as i32, block), all()])
                .store(x.cast(T::DTYPE).reshape(&[1, block, d]));
        }
    }

    /// The accumulated dq into gradient 0 of `grads`.
    fn store_dq<T: Element>(&self, dq_acc: &Vmem<f32>, grads: &mut Vmem<T>, s_len: usize) {
        let (block, d) = (self.block, dq_acc.shape()[1]);
        fori_loop(0, (s_len / block) as i32, (), |i, ()| {
            let dq_i = dq_acc.at(&self.flat(i)).load().cast(T::DTYPE);
            grads
                .at_mut(&[ds(0, 1), ds(i * block as i32, block), all()])
                .store(dq_i.reshape(&[1, block, d]));
        });
    }
}

/// A key block of the backward, as its query blocks meet it.
struct KeyBlock<'a> {
    head: &'a HeadGrads<'a>,
    j: Value,
    kj: Value,
    vj: Value,
    scale: f32,
}

impl KeyBlock<'_> {
    /// `(dk, dv)` before the first query block.
    fn init(&self) -> (Value, Value) {
        let zeros = || constant(DType::F32, &self.kj.shape(), 0.0);
        (zeros(), zeros())
    }

    /// `(dk, dv)` past query block `i` (its queries and output cotangent `[block, D]`), and
    /// its dq added to `dq_acc` (`ds = p (dp - di)`, `p = exp(logits - lse)`).
    fn step<T: Element>(
        &self,
        (dkj, dvj): (Value, Value),
        i: Value,
        qi: Value,
        d_oi: Value,
        dq_acc: &mut Vmem<f32>,
    ) -> (Value, Value) {
        let h = self.head;
        let block = h.block;
        let qi = scaled_queries::<T>(qi, self.scale);
        let capped = h.logits.of(dot_nt(qi, self.kj));
        let s_ij = h
            .visible
            .masked(capped, i * block as i32, self.j * block as i32, block);
        let q_ids = query_segments(h.segments, i, block);
        let s_ij = segment_masked(s_ij, h.segments, q_ids, self.j, block);
        let p = (s_ij - h.column(h.lse, i)).exp();
        let dp = dot_nt(d_oi, self.vj);
        let ds_ij = h.logits.uncapped(p * (dp - h.column(h.di, i)), capped);
        let dq_i = dq_acc.at(&h.flat(i)).load() + dot(ds_ij.cast(T::DTYPE), self.kj) * self.scale;
        dq_acc.at_mut(&h.flat(i)).store(dq_i);
        (
            dkj + dot_tn(ds_ij.cast(T::DTYPE), qi),
            dvj + dot_tn(p.cast(T::DTYPE), d_oi),
        )
    }
}

/// Each gradient's chunk `s` of `grads` (`[3, S, D]`: dq, dk, dv of head `hl`) to device
/// `s` (the device `k` along), as its rows of head `me HL + hl` of `outs`; then the sends,
/// and every owner's chunk of this device's rows. The chunks share their semaphores (`[send,
/// receive, local]`) but for this device's own (as in the forward).
fn send_grads_back<T: Element, A: MeshAxis, M: HasAxis<A>>(
    x: &Exchange<'_, M>,
    devices: &Devices<M>,
    hl: Value,
    grads: &Vmem<T>,
    outs: [&mut HbmMut<T>; 3],
    [sent, landed, local]: [&DmaSem; 3],
) {
    let sl = x.rows;
    let chunk = |g: usize, s: Value| [ds(g, 1), ds(s * sl as i32, sl), all()];
    for (g, out) in outs.into_iter().enumerate() {
        let dst = x.head(x.me, hl, 3);
        async_copy(grads.at(&chunk(g, x.me)), out.at_mut(&dst), local).wait();
        for k in 1..x.n {
            let s = x.along(k);
            let to = devices.shifted::<A>(k as i64);
            remote_copy(grads.at(&chunk(g, s)), out.at_mut(&dst), sent, landed, to).detach();
        }
        for k in 1..x.n {
            let (to, from) = (x.along(k), x.back(k));
            wait_copy(grads.at(&chunk(g, to)), out.at_mut(&dst), sent);
            let theirs = out.at_mut(&x.head(from, hl, 3));
            wait_copy(grads.at(&chunk(g, x.me)), theirs, landed);
        }
    }
}

/// [`ulysses_attention_bwd_of`] for f32, with the default logits (`visible`: a
/// [`Visibility`], or `true` for causal and `false` for full).
pub fn ulysses_attention_bwd<M: MeshShape + HasAxis<A>, A: MeshAxis>(
    block: usize,
    visible: impl Into<Visibility>,
) -> KernelDef {
    ulysses_attention_bwd_of::<f32, M, A>(block, visible.into(), Logits::default())
}

/// [`ulysses_attention_of`] for f32, with the default logits (`visible` as
/// [`ulysses_attention_bwd`]'s).
pub fn ulysses_attention<M: MeshShape + HasAxis<A>, A: MeshAxis>(
    block: usize,
    visible: impl Into<Visibility>,
) -> KernelDef {
    ulysses_attention_of::<f32, M, A>(block, visible.into(), Logits::default())
}

/// The f64 reference of [`ulysses_attention_of`], written apart from it: every device's
/// `[out, lse]` (`[H, SL, D]` and `[H, SL]`) from every device's `q`, `k`, `v` shards
/// (`[H, SL, D]` each, in axis order), by dense attention over the whole sequence per head.
pub fn ulysses_attention_reference(
    q: &[HostArray],
    k: &[HostArray],
    v: &[HostArray],
    visible: impl Into<Visibility>,
) -> Vec<[Vec<f64>; 2]> {
    let visible = visible.into();
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
    let mut out = vec![[vec![0.0; h * sl * d], vec![0.0; h * sl]]; n];
    for hh in 0..h {
        let (qh, kh, vh) = (whole(q, hh), whole(k, hh), whole(v, hh));
        for i in 0..s {
            let keys: Vec<usize> = (0..s).filter(|&j| visible.sees(i, j)).collect();
            let logits: Vec<f64> = keys
                .iter()
                .map(|&j| scale * (0..d).map(|c| qh[i * d + c] * kh[j * d + c]).sum::<f64>())
                .collect();
            let top = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = logits.iter().map(|x| (x - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            let (dev, row) = (i / sl, i % sl);
            for c in 0..d {
                let o: f64 = keys
                    .iter()
                    .zip(&weights)
                    .map(|(&j, w)| w * vh[j * d + c])
                    .sum();
                out[dev][0][(hh * sl + row) * d + c] = o / total;
            }
            out[dev][1][hh * sl + row] = top + total.ln();
        }
    }
    out
}

/// The f64 reference of [`ulysses_attention_bwd_of`], written apart from it: every device's
/// `[dq, dk, dv]` (its rows of each, `[H, SL, D]`) for the cotangent `dout` of the output,
/// from dense attention's backward per head over the whole sequence: `p = softmax(scale q
/// k^T)`, `dv = p^T dout`, `ds = p (dout v^T - rowsum(p (dout v^T)))`, `dq = scale ds k`,
/// `dk = scale ds^T q`.
pub fn ulysses_attention_bwd_reference(
    q: &[HostArray],
    k: &[HostArray],
    v: &[HostArray],
    dout: &[HostArray],
    visible: impl Into<Visibility>,
) -> Vec<[Vec<f64>; 3]> {
    let visible = visible.into();
    let n = q.len();
    let [h, sl, d] = [q[0].shape()[0], q[0].shape()[1], q[0].shape()[2]];
    let s = n * sl;
    let whole = |x: &[HostArray], hh: usize| -> Vec<f64> {
        (0..n)
            .flat_map(|dev| x[dev].to_f64_vec()[hh * sl * d..(hh + 1) * sl * d].to_vec())
            .collect()
    };
    let scale = 1.0 / (d as f64).sqrt();
    let dot = |a: &[f64], i: usize, b: &[f64], j: usize| -> f64 {
        (0..d).map(|c| a[i * d + c] * b[j * d + c]).sum()
    };
    let mut grads = vec![
        [
            vec![0.0; h * sl * d],
            vec![0.0; h * sl * d],
            vec![0.0; h * sl * d]
        ];
        n
    ];
    for hh in 0..h {
        let (qh, kh, vh, doh) = (whole(q, hh), whole(k, hh), whole(v, hh), whole(dout, hh));
        let (mut dqh, mut dkh, mut dvh) = (vec![0.0; s * d], vec![0.0; s * d], vec![0.0; s * d]);
        for i in 0..s {
            let keys: Vec<usize> = (0..s).filter(|&j| visible.sees(i, j)).collect();
            let logits: Vec<f64> = keys.iter().map(|&j| scale * dot(&qh, i, &kh, j)).collect();
            let top = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = logits.iter().map(|x| (x - top).exp()).collect();
            let total: f64 = e.iter().sum();
            let p: Vec<f64> = e.iter().map(|x| x / total).collect();
            let dp: Vec<f64> = keys.iter().map(|&j| dot(&doh, i, &vh, j)).collect();
            let row: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for (n, &j) in keys.iter().enumerate() {
                let ds = p[n] * (dp[n] - row);
                for c in 0..d {
                    dvh[j * d + c] += p[n] * doh[i * d + c];
                    dqh[i * d + c] += scale * ds * kh[j * d + c];
                    dkh[j * d + c] += scale * ds * qh[i * d + c];
                }
            }
        }
        for (g, whole) in [dqh, dkh, dvh].into_iter().enumerate() {
            for (i, row) in whole.chunks(d).enumerate() {
                let (dev, r) = (i / sl, i % sl);
                grads[dev][g][(hh * sl + r) * d..(hh * sl + r + 1) * d].copy_from_slice(row);
            }
        }
    }
    grads
}
