//! Parses the Mosaic subset tessera emits into functions of [`Op`]s.

use std::collections::{HashMap, HashSet};

use tessera_array::DType;

use crate::lex::{lex, Tok};
use crate::EvalError;

mod memory;

pub(crate) use memory::MemOp;

/// Element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    F32,
    BF16,
    I32,
    I8,
    I1,
    Index,
    /// DMA semaphores (`!tpu.dma_semaphore`), counting bytes.
    DmaSem,
    /// Regular and barrier semaphores (`!tpu.semaphore`).
    Sem,
}

impl Elem {
    /// The name errors print (the variant's name, as `{:?}` spells it).
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "F32",
            Elem::BF16 => "BF16",
            Elem::I32 => "I32",
            Elem::I8 => "I8",
            Elem::I1 => "I1",
            Elem::Index => "Index",
            Elem::DmaSem => "DmaSem",
            Elem::Sem => "Sem",
        }
    }

    fn parse(s: &str) -> Option<Elem> {
        Some(match s {
            "f32" => Elem::F32,
            "bf16" => Elem::BF16,
            "i32" => Elem::I32,
            "i8" => Elem::I8,
            "i1" => Elem::I1,
            "index" => Elem::Index,
            "!tpu.dma_semaphore" => Elem::DmaSem,
            "!tpu.semaphore" => Elem::Sem,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::BF16)
    }

    /// Bytes per element in memory (what a DMA semaphore counts).
    pub fn bytes(self) -> usize {
        match self {
            Elem::BF16 => 2,
            Elem::I8 | Elem::I1 => 1,
            _ => 4,
        }
    }

    /// The array dtype of this element type (`index` values are held as i32).
    pub fn dtype(self) -> DType {
        match self {
            Elem::F32 => DType::F32,
            Elem::BF16 => DType::BF16,
            Elem::I32 | Elem::Index => DType::I32,
            Elem::I8 => DType::I8,
            Elem::I1 => DType::Bool,
            // Semaphore counts.
            Elem::DmaSem | Elem::Sem => DType::I32,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Type {
    Scalar(Elem),
    Vector(Vec<usize>, Elem),
    MemRef {
        shape: Vec<usize>,
        elem: Elem,
        space: String,
    },
}

impl Type {
    pub fn elem(&self) -> Elem {
        match self {
            Type::Scalar(e) | Type::Vector(_, e) | Type::MemRef { elem: e, .. } => *e,
        }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            Type::Scalar(_) => &[],
            Type::Vector(s, _) | Type::MemRef { shape: s, .. } => s,
        }
    }
}

/// `AxBxC` dims and an element type, as in `vector<...>` and `memref<...>`.
fn shaped(body: &str) -> Option<(Vec<usize>, Elem)> {
    let parts: Vec<&str> = body.split('x').collect();
    let (elem, dims) = parts.split_last()?;
    let dims = dims
        .iter()
        .map(|d| d.trim().parse().ok())
        .collect::<Option<Vec<usize>>>()?;
    Some((dims, Elem::parse(elem.trim())?))
}

/// A generic attribute value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Attr {
    /// A number, possibly typed (`2 : i64`).
    Num(String),
    Ident(String),
    Angle(String, String),
    Sym(String),
    Str(String),
    List(Vec<Attr>),
    Dict(Vec<(String, Attr)>),
}

/// Element-wise and casting ops that take operands and produce one value of `ty`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OpKind {
    /// `arith.constant`: a scalar or a dense splat.
    Constant {
        literal: String,
        ty: Type,
    },
    /// Binary `arith` ops (`arith.addf`, ...), by name.
    Binary {
        name: String,
        a: String,
        b: String,
        ty: Type,
    },
    /// `arith.negf` and `math.*`, by name.
    Unary {
        name: String,
        x: String,
        ty: Type,
    },
    Compare {
        float: bool,
        pred: String,
        a: String,
        b: String,
        ty: Type,
    },
    Select {
        cond: String,
        a: String,
        b: String,
        ty: Type,
    },
    /// `arith.extf`, `truncf`, `sitofp`, `fptosi`, `extsi`, `trunci`, `extui`, `index_cast`.
    Cast {
        name: String,
        x: String,
        to: Type,
    },
    VectorLoad {
        mem: String,
        indices: Vec<String>,
        ty: Type,
    },
    VectorStore {
        mem: String,
        indices: Vec<String>,
        value: String,
    },
    MemrefLoad {
        mem: String,
        indices: Vec<String>,
    },
    /// `memref.store %v, %m[%i, ..]`: one scalar into SMEM.
    MemrefStore {
        mem: String,
        indices: Vec<String>,
        value: String,
    },
    Broadcast {
        x: String,
        to: Type,
    },
    ShapeCast {
        x: String,
        to: Type,
    },
    Extract {
        x: String,
        position: Vec<usize>,
    },
    Iota {
        dim: usize,
        ty: Type,
    },
    MultiReduction {
        kind: String,
        src: String,
        acc: String,
        dims: Vec<usize>,
        ty: Type,
    },
    /// `tpu.concatenate` of vectors along `dim` (Pallas' `jnp.tile` and `jnp.concatenate`).
    Concatenate {
        sources: Vec<String>,
        dim: usize,
        ty: Type,
    },
    /// `tpu.matmul` with rank-2 operands: which dim of each operand contracts.
    Matmul {
        lhs: String,
        rhs: String,
        acc: String,
        lhs_contract: usize,
        rhs_contract: usize,
        ty: Type,
    },
    /// `scf.if` without results; the `else` region may be absent or empty (Pallas prints
    /// `else {}` for a `pl.when`).
    If {
        cond: String,
        then: Vec<Op>,
        otherwise: Vec<Op>,
    },
    For {
        iv: String,
        lo: String,
        hi: String,
        step: String,
        iter_args: Vec<(String, String)>,
        body: Vec<Op>,
    },
    Yield {
        values: Vec<String>,
    },
    Return {
        values: Vec<String>,
    },
    /// Memory, semaphore and device ops (`parse/memory.rs`).
    Mem(MemOp),
    /// `"tpu.log"(%a, ..) <{formatted = B, tag = "..."}> : (T, ..) -> ()`: prints the tag,
    /// its `$N` replaced by operand N when `formatted`.
    Log {
        tag: String,
        formatted: bool,
        values: Vec<String>,
    },
    /// `"tpu.log_buffer"(%m) <{shape = array<i64: ..>, tag = "..."}> : (T) -> ()`: prints
    /// the tag and the buffer's contents.
    LogBuffer {
        mem: String,
        tag: String,
    },
    /// `cf.assert %c, "message"`.
    Assert {
        cond: String,
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Op {
    pub results: Vec<String>,
    pub kind: OpKind,
    /// `file:line:col` of the op's `loc`, or the line in the module text.
    pub loc: String,
    /// The op has results and nothing in its function uses them (Pallas loads a ref's old
    /// contents before every store to it and drops them).
    pub unused: bool,
}

impl OpKind {
    /// The values the op reads, and the ops of its regions.
    fn uses(&self) -> (Vec<&String>, Vec<&Op>) {
        let mut regions: Vec<&Op> = Vec::new();
        let values: Vec<&String> = match self {
            OpKind::Constant { .. } | OpKind::Iota { .. } => vec![],
            OpKind::Binary { a, b, .. } | OpKind::Compare { a, b, .. } => vec![a, b],
            OpKind::Unary { x, .. }
            | OpKind::Cast { x, .. }
            | OpKind::Broadcast { x, .. }
            | OpKind::ShapeCast { x, .. }
            | OpKind::Extract { x, .. } => vec![x],
            OpKind::Select { cond, a, b, .. } => vec![cond, a, b],
            OpKind::VectorLoad { mem, indices, .. } | OpKind::MemrefLoad { mem, indices } => {
                std::iter::once(mem).chain(indices).collect()
            }
            OpKind::VectorStore {
                mem,
                indices,
                value,
            }
            | OpKind::MemrefStore {
                mem,
                indices,
                value,
            } => std::iter::once(mem).chain(indices).chain([value]).collect(),
            OpKind::MultiReduction { src, acc, .. } => vec![src, acc],
            OpKind::Concatenate { sources, .. } => sources.iter().collect(),
            OpKind::Matmul { lhs, rhs, acc, .. } => vec![lhs, rhs, acc],
            OpKind::If {
                cond,
                then,
                otherwise,
            } => {
                regions.extend(then.iter().chain(otherwise));
                vec![cond]
            }
            OpKind::For {
                lo,
                hi,
                step,
                iter_args,
                body,
                ..
            } => {
                regions.extend(body);
                [lo, hi, step]
                    .into_iter()
                    .chain(iter_args.iter().map(|(_, init)| init))
                    .collect()
            }
            OpKind::Yield { values } | OpKind::Return { values } | OpKind::Log { values, .. } => {
                values.iter().collect()
            }
            OpKind::LogBuffer { mem, .. } => vec![mem],
            OpKind::Assert { cond, .. } => vec![cond],
            OpKind::Mem(m) => {
                let (values, body) = m.uses();
                regions.extend(body);
                values
            }
        };
        (values, regions)
    }
}

/// Every value the ops (and their regions) read.
fn used_values<'a>(ops: &'a [Op], used: &mut HashSet<&'a String>) {
    for op in ops {
        let (values, regions) = op.kind.uses();
        used.extend(values);
        for r in regions {
            used_values(std::slice::from_ref(r), used);
        }
    }
}

/// Marks the ops whose results nothing reads. A value is visible to the ops after it in its
/// region and to their regions; sibling regions reuse names (MLIR's printer numbers each
/// region's values afresh), so uses are looked for there only.
fn mark_unused(ops: &mut [Op]) {
    let mut later: HashSet<String> = HashSet::new();
    for op in ops.iter_mut().rev() {
        op.unused = !op.results.is_empty() && op.results.iter().all(|r| !later.contains(r));
        let mut uses = HashSet::new();
        used_values(std::slice::from_ref(op), &mut uses);
        later.extend(uses.into_iter().cloned());
        match &mut op.kind {
            OpKind::If {
                then, otherwise, ..
            } => {
                mark_unused(then);
                mark_unused(otherwise);
            }
            OpKind::For { body, .. } => mark_unused(body),
            _ => {}
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Func {
    pub name: String,
    pub args: Vec<(String, Type)>,
    pub attrs: Vec<(String, Attr)>,
    pub body: Vec<Op>,
}

impl Func {
    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.iter().find(|(n, _)| n == name).map(|(_, a)| a)
    }
}

pub(crate) fn parse_module(text: &str) -> Result<HashMap<String, Func>, EvalError> {
    let lexed = lex(text)?;
    let mut p = Parser {
        toks: lexed.toks,
        lines: lexed.lines,
        pos: 0,
    };
    p.expect_ident("module")?;
    if p.eat_ident("attributes") {
        p.attr_dict()?;
    }
    p.expect("{")?;
    let mut funcs = HashMap::new();
    while !p.eat("}") {
        let f = p.func()?;
        funcs.insert(f.name.clone(), f);
    }
    if p.pos != p.toks.len() {
        return Err(p.error("text after the module"));
    }
    Ok(funcs)
}

struct Parser {
    toks: Vec<Tok>,
    lines: Vec<usize>,
    pos: usize,
}

type R<T> = Result<T, EvalError>;

impl Parser {
    fn error(&self, message: impl Into<String>) -> EvalError {
        let line = self
            .lines
            .get(self.pos)
            .or(self.lines.last())
            .copied()
            .unwrap_or(0);
        let near = self
            .toks
            .get(self.pos)
            .map(|t| format!(" (at {t:?})"))
            .unwrap_or_default();
        EvalError::Parse {
            line,
            message: format!("{}{near}", message.into()),
        }
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn next(&mut self) -> R<Tok> {
        let t = self
            .toks
            .get(self.pos)
            .cloned()
            .ok_or_else(|| self.error("unexpected end of text"))?;
        self.pos += 1;
        Ok(t)
    }

    fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Punct(q)) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, p: &str) -> R<()> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{p}`")))
        }
    }

    fn eat_ident(&mut self, name: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Ident(n)) if n == name) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_ident(&mut self, name: &str) -> R<()> {
        if self.eat_ident(name) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{name}`")))
        }
    }

    fn value(&mut self) -> R<String> {
        match self.next()? {
            Tok::Value(v) => Ok(v),
            _ => {
                self.pos -= 1;
                Err(self.error("expected an SSA value"))
            }
        }
    }

    fn values(&mut self) -> R<Vec<String>> {
        let mut out = vec![self.value()?];
        while self.eat(",") {
            out.push(self.value()?);
        }
        Ok(out)
    }

    fn number(&mut self) -> R<String> {
        match self.next()? {
            Tok::Num(n) => Ok(n),
            _ => {
                self.pos -= 1;
                Err(self.error("expected a number"))
            }
        }
    }

    fn usize(&mut self) -> R<usize> {
        let n = self.number()?;
        n.parse()
            .map_err(|_| self.error(format!("`{n}` is not an index")))
    }

    fn ty(&mut self) -> R<Type> {
        match self.next()? {
            Tok::Ident(s) => match Elem::parse(&s) {
                Some(e) => Ok(Type::Scalar(e)),
                None => Err(self.error(format!("unsupported type `{s}`"))),
            },
            Tok::Angle(kind, body) if kind == "vector" => match shaped(&body) {
                Some((shape, elem)) => Ok(Type::Vector(shape, elem)),
                None => Err(self.error(format!("unsupported vector type `vector<{body}>`"))),
            },
            Tok::Angle(kind, body) if kind == "memref" => {
                let (dims, space) = body.split_once(',').unwrap_or((&body, ""));
                let space = space.trim();
                let space = space
                    .strip_prefix("#tpu.memory_space<")
                    .and_then(|s| s.strip_suffix('>'))
                    .ok_or_else(|| {
                        self.error(format!("memref<{body}> has no #tpu.memory_space"))
                    })?;
                match shaped(dims) {
                    Some((shape, elem)) => Ok(Type::MemRef {
                        shape,
                        elem,
                        space: space.to_string(),
                    }),
                    None => Err(self.error(format!("unsupported memref type `memref<{body}>`"))),
                }
            }
            _ => {
                self.pos -= 1;
                Err(self.error("expected a type"))
            }
        }
    }

    fn attr(&mut self) -> R<Attr> {
        let a = match self.next()? {
            Tok::Num(n) => Attr::Num(n),
            Tok::Ident(s) => Attr::Ident(s),
            Tok::Angle(k, b) => Attr::Angle(k, b),
            Tok::Sym(s) => Attr::Sym(s),
            Tok::Str(s) => Attr::Str(s),
            Tok::Punct("[") => {
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.attr()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                Attr::List(items)
            }
            Tok::Punct("{") => {
                self.pos -= 1;
                Attr::Dict(self.attr_dict()?)
            }
            _ => {
                self.pos -= 1;
                return Err(self.error("expected an attribute"));
            }
        };
        // A typed number: `2 : i64`.
        if matches!(a, Attr::Num(_)) && self.eat(":") {
            match self.next()? {
                Tok::Ident(_) => {}
                _ => return Err(self.error("expected the type of a number attribute")),
            }
        }
        Ok(a)
    }

    fn attr_dict(&mut self) -> R<Vec<(String, Attr)>> {
        self.expect("{")?;
        let mut out = Vec::new();
        if self.eat("}") {
            return Ok(out);
        }
        loop {
            let name = match self.next()? {
                Tok::Ident(n) | Tok::Str(n) => n,
                _ => return Err(self.error("expected an attribute name")),
            };
            self.expect("=")?;
            out.push((name, self.attr()?));
            if self.eat("}") {
                return Ok(out);
            }
            self.expect(",")?;
        }
    }

    /// An optional trailing `loc("file":line:col)`; else the text line.
    fn loc(&mut self, line: usize) -> R<String> {
        if !self.eat_ident("loc") {
            return Ok(format!("line {line} of the module"));
        }
        self.expect("(")?;
        let file = match self.next()? {
            Tok::Str(s) => s,
            _ => return Err(self.error("expected a file name in `loc`")),
        };
        self.expect(":")?;
        let l = self.number()?;
        self.expect(":")?;
        let c = self.number()?;
        self.expect(")")?;
        Ok(format!("{file}:{l}:{c}"))
    }

    fn func(&mut self) -> R<Func> {
        self.expect_ident("func.func")?;
        let name = match self.next()? {
            Tok::Sym(s) => s,
            _ => return Err(self.error("expected the function's @name")),
        };
        self.expect("(")?;
        let mut args = Vec::new();
        if !self.eat(")") {
            loop {
                let v = self.value()?;
                self.expect(":")?;
                args.push((v, self.ty()?));
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
        }
        if self.eat("->") {
            self.expect("(")?;
            if !self.eat(")") {
                loop {
                    self.ty()?;
                    if self.eat(")") {
                        break;
                    }
                    self.expect(",")?;
                }
            }
        }
        let attrs = if self.eat_ident("attributes") {
            self.attr_dict()?
        } else {
            Vec::new()
        };
        let mut body = self.block()?;
        let line = self.lines.get(self.pos).copied().unwrap_or(0);
        self.loc(line)?;
        mark_unused(&mut body);
        Ok(Func {
            name,
            args,
            attrs,
            body,
        })
    }

    /// `{ op* }`.
    fn block(&mut self) -> R<Vec<Op>> {
        self.expect("{")?;
        let mut ops = Vec::new();
        while !self.eat("}") {
            ops.push(self.op()?);
        }
        Ok(ops)
    }

    fn op(&mut self) -> R<Op> {
        let line = self.lines.get(self.pos).copied().unwrap_or(0);
        let mut results = Vec::new();
        if matches!(self.peek(), Some(Tok::Value(_))) {
            let first = self.value()?;
            if self.eat(":") {
                // `%r:N = ...`: N results `%r#0`..
                let n = self.usize()?;
                results.extend((0..n).map(|i| format!("{first}#{i}")));
            } else {
                results.push(first);
                while self.eat(",") {
                    results.push(self.value()?);
                }
            }
            self.expect("=")?;
        }
        let name = match self.next()? {
            Tok::Ident(n) => n,
            // The generic form, for ops without a custom one (`"tpu.region"`).
            Tok::Str(n) if matches!(n.as_str(), "tpu.region" | "tpu.log" | "tpu.log_buffer") => n,
            _ => return Err(self.error("expected an op name")),
        };
        let kind = self.op_body(&name)?;
        let loc = self.loc(line)?;
        Ok(Op {
            results,
            kind,
            loc,
            unused: false,
        })
    }

    /// `%a : T to U` (casts, broadcasts, shape casts).
    fn conversion(&mut self) -> R<(String, Type)> {
        let x = self.value()?;
        self.expect(":")?;
        self.ty()?;
        self.expect_ident("to")?;
        Ok((x, self.ty()?))
    }

    fn indices(&mut self) -> R<Vec<String>> {
        self.expect("[")?;
        if self.eat("]") {
            return Ok(Vec::new());
        }
        let v = self.values()?;
        self.expect("]")?;
        Ok(v)
    }

    fn op_body(&mut self, name: &str) -> R<OpKind> {
        Ok(match name {
            "arith.constant" => {
                let literal = match self.next()? {
                    Tok::Num(n) | Tok::Ident(n) => n,
                    Tok::Angle(k, body) if k == "dense" => body,
                    _ => return Err(self.error("expected a constant value")),
                };
                // `true` and `false` are typed (i1) by themselves.
                let ty = if self.eat(":") {
                    self.ty()?
                } else if matches!(literal.as_str(), "true" | "false") {
                    Type::Scalar(Elem::I1)
                } else {
                    return Err(self.error("expected `:` and the constant's type"));
                };
                OpKind::Constant { literal, ty }
            }
            "arith.addf" | "arith.subf" | "arith.mulf" | "arith.divf" | "arith.remf"
            | "arith.maximumf" | "arith.minimumf" | "arith.addi" | "arith.subi" | "arith.muli"
            | "arith.divsi" | "arith.remsi" | "arith.maxsi" | "arith.minsi" | "arith.andi"
            | "arith.ori" | "arith.xori" => {
                let a = self.value()?;
                self.expect(",")?;
                let b = self.value()?;
                self.expect(":")?;
                OpKind::Binary {
                    name: name.to_string(),
                    a,
                    b,
                    ty: self.ty()?,
                }
            }
            "arith.negf" | "math.exp" | "math.log" | "math.tanh" | "math.sqrt" | "math.rsqrt"
            | "math.absf" | "math.absi" => {
                let x = self.value()?;
                self.expect(":")?;
                OpKind::Unary {
                    name: name.to_string(),
                    x,
                    ty: self.ty()?,
                }
            }
            "arith.cmpf" | "arith.cmpi" => {
                let pred = match self.next()? {
                    Tok::Ident(p) => p,
                    _ => return Err(self.error("expected a predicate")),
                };
                self.expect(",")?;
                let a = self.value()?;
                self.expect(",")?;
                let b = self.value()?;
                self.expect(":")?;
                OpKind::Compare {
                    float: name == "arith.cmpf",
                    pred,
                    a,
                    b,
                    ty: self.ty()?,
                }
            }
            "arith.select" => {
                let cond = self.value()?;
                self.expect(",")?;
                let a = self.value()?;
                self.expect(",")?;
                let b = self.value()?;
                self.expect(":")?;
                let mut ty = self.ty()?;
                if self.eat(",") {
                    ty = self.ty()?;
                }
                OpKind::Select { cond, a, b, ty }
            }
            "arith.extf" | "arith.truncf" | "arith.sitofp" | "arith.fptosi" | "arith.extsi"
            | "arith.trunci" | "arith.extui" | "arith.index_cast" => {
                let (x, to) = self.conversion()?;
                OpKind::Cast {
                    name: name.to_string(),
                    x,
                    to,
                }
            }
            "vector.load" => {
                let mem = self.value()?;
                let indices = self.indices()?;
                self.expect(":")?;
                self.ty()?;
                self.expect(",")?;
                OpKind::VectorLoad {
                    mem,
                    indices,
                    ty: self.ty()?,
                }
            }
            "tpu.vector_store" => {
                let mem = self.value()?;
                let indices = self.indices()?;
                self.expect(",")?;
                let value = self.value()?;
                let attrs = self.attr_dict()?;
                if attrs
                    != [(
                        "strides".to_string(),
                        Attr::Angle("array".into(), "i32".into()),
                    )]
                {
                    return Err(
                        self.error("tpu.vector_store: only `{strides = array<i32>}` is supported")
                    );
                }
                self.expect(":")?;
                self.ty()?;
                self.expect(",")?;
                self.ty()?;
                // The (absent) mask's type list ends with a comma.
                self.expect(",")?;
                OpKind::VectorStore {
                    mem,
                    indices,
                    value,
                }
            }
            "tpu.log" | "tpu.log_buffer" => {
                self.expect("(")?;
                let values = if self.eat(")") {
                    Vec::new()
                } else {
                    let v = self.values()?;
                    self.expect(")")?;
                    v
                };
                self.expect("<")?;
                let props = self.attr_dict()?;
                self.expect(">")?;
                self.expect(":")?;
                self.expect("(")?;
                while !self.eat(")") {
                    self.ty()?;
                    self.eat(",");
                }
                self.expect("->")?;
                self.expect("(")?;
                self.expect(")")?;
                let prop = |n: &str| props.iter().find(|(k, _)| k == n).map(|(_, a)| a);
                let tag = match prop("tag") {
                    Some(Attr::Str(t)) => t.clone(),
                    _ => return Err(self.error(format!("{name}: expected a string `tag`"))),
                };
                match (name, values.as_slice()) {
                    ("tpu.log", _) => OpKind::Log {
                        tag,
                        formatted: matches!(prop("formatted"), Some(Attr::Ident(b)) if b == "true"),
                        values,
                    },
                    (_, [mem]) => OpKind::LogBuffer {
                        mem: mem.clone(),
                        tag,
                    },
                    _ => return Err(self.error("tpu.log_buffer: expected one memref")),
                }
            }
            "cf.assert" => {
                let cond = self.value()?;
                self.expect(",")?;
                let message = match self.next()? {
                    Tok::Str(m) => m,
                    _ => return Err(self.error("cf.assert: expected the message")),
                };
                OpKind::Assert { cond, message }
            }
            "memref.load" => {
                let mem = self.value()?;
                let indices = self.indices()?;
                self.expect(":")?;
                self.ty()?;
                OpKind::MemrefLoad { mem, indices }
            }
            "memref.store" => {
                let value = self.value()?;
                self.expect(",")?;
                let mem = self.value()?;
                let indices = self.indices()?;
                self.expect(":")?;
                self.ty()?;
                OpKind::MemrefStore {
                    mem,
                    indices,
                    value,
                }
            }
            "vector.broadcast" => {
                let (x, to) = self.conversion()?;
                OpKind::Broadcast { x, to }
            }
            "vector.shape_cast" => {
                let (x, to) = self.conversion()?;
                OpKind::ShapeCast { x, to }
            }
            "vector.extract" => {
                let x = self.value()?;
                self.expect("[")?;
                let mut position = vec![self.usize()?];
                while self.eat(",") {
                    position.push(self.usize()?);
                }
                self.expect("]")?;
                self.expect(":")?;
                self.ty()?;
                self.expect_ident("from")?;
                self.ty()?;
                OpKind::Extract { x, position }
            }
            "tpu.iota" => {
                let attrs = self.attr_dict()?;
                let dim = match attrs.as_slice() {
                    [(n, Attr::Angle(k, body))] if n == "dimensions" && k == "array" => body
                        .strip_prefix("i32:")
                        .and_then(|d| d.trim().parse().ok()),
                    _ => None,
                }
                .ok_or_else(|| self.error("tpu.iota: expected `{dimensions = array<i32: D>}`"))?;
                self.expect(":")?;
                OpKind::Iota {
                    dim,
                    ty: self.ty()?,
                }
            }
            "vector.multi_reduction" => {
                self.expect("<")?;
                let kind = match self.next()? {
                    Tok::Ident(k) => k,
                    _ => return Err(self.error("expected a reduction kind")),
                };
                self.expect(">")?;
                self.expect(",")?;
                let src = self.value()?;
                self.expect(",")?;
                let acc = self.value()?;
                self.expect("[")?;
                let mut dims = vec![self.usize()?];
                while self.eat(",") {
                    dims.push(self.usize()?);
                }
                self.expect("]")?;
                self.expect(":")?;
                self.ty()?;
                self.expect_ident("to")?;
                OpKind::MultiReduction {
                    kind,
                    src,
                    acc,
                    dims,
                    ty: self.ty()?,
                }
            }
            "tpu.matmul" => {
                let lhs = self.value()?;
                self.expect(",")?;
                let rhs = self.value()?;
                self.expect(",")?;
                let acc = self.value()?;
                let attrs = self.attr_dict()?;
                let (lhs_contract, rhs_contract) = attrs
                    .iter()
                    .find(|(n, _)| n == "dimension_numbers")
                    .and_then(|(_, a)| match a {
                        Attr::Angle(k, body) if k == "#tpu.dot_dimension_numbers" => {
                            dot_contracting(body)
                        }
                        _ => None,
                    })
                    .ok_or_else(|| {
                        self.error("tpu.matmul: unsupported or missing dimension_numbers")
                    })?;
                self.expect(":")?;
                self.ty()?;
                self.expect(",")?;
                self.ty()?;
                self.expect(",")?;
                self.ty()?;
                self.expect("->")?;
                OpKind::Matmul {
                    lhs,
                    rhs,
                    acc,
                    lhs_contract,
                    rhs_contract,
                    ty: self.ty()?,
                }
            }
            "tpu.concatenate" => {
                let sources = self.values()?;
                self.expect_ident("in")?;
                let dim = self.usize()?;
                self.expect(":")?;
                for _ in &sources[1..] {
                    self.ty()?;
                    self.expect(",")?;
                }
                self.ty()?;
                self.expect("->")?;
                OpKind::Concatenate {
                    sources,
                    dim,
                    ty: self.ty()?,
                }
            }
            "scf.if" => {
                let cond = self.value()?;
                let then = self.block()?;
                let otherwise = if self.eat_ident("else") {
                    self.block()?
                } else {
                    Vec::new()
                };
                OpKind::If {
                    cond,
                    then,
                    otherwise,
                }
            }
            "scf.for" => {
                let iv = self.value()?;
                self.expect("=")?;
                let lo = self.value()?;
                self.expect_ident("to")?;
                let hi = self.value()?;
                self.expect_ident("step")?;
                let step = self.value()?;
                let mut iter_args = Vec::new();
                if self.eat_ident("iter_args") {
                    self.expect("(")?;
                    loop {
                        let a = self.value()?;
                        self.expect("=")?;
                        iter_args.push((a, self.value()?));
                        if self.eat(")") {
                            break;
                        }
                        self.expect(",")?;
                    }
                    self.expect("->")?;
                    self.expect("(")?;
                    loop {
                        self.ty()?;
                        if self.eat(")") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                if self.eat(":") {
                    self.ty()?;
                }
                let body = self.block()?;
                OpKind::For {
                    iv,
                    lo,
                    hi,
                    step,
                    iter_args,
                    body,
                }
            }
            "scf.yield" | "return" | "func.return" => {
                let values = if matches!(self.peek(), Some(Tok::Value(_))) {
                    let v = self.values()?;
                    self.expect(":")?;
                    self.ty()?;
                    while self.eat(",") {
                        self.ty()?;
                    }
                    v
                } else {
                    Vec::new()
                };
                if name == "scf.yield" {
                    OpKind::Yield { values }
                } else {
                    OpKind::Return { values }
                }
            }
            other => match self.memory_op(other)? {
                Some(kind) => kind,
                None => {
                    return Err(self.error(format!(
                        "`{other}` is not part of the Mosaic subset this evaluator runs"
                    )))
                }
            },
        })
    }
}

/// The contracting dims of a rank-2 `#tpu.dot_dimension_numbers<lc, rc, lnc, rnc, order,
/// lb, rb>` without batch dims.
fn dot_contracting(body: &str) -> Option<(usize, usize)> {
    let lists: Vec<Vec<usize>> = body
        .split(']')
        .filter_map(|part| {
            let inner = part.trim_start_matches([',', ' ']).strip_prefix('[')?;
            inner
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().parse().ok())
                .collect::<Option<Vec<usize>>>()
        })
        .collect();
    match lists.as_slice() {
        [lc, rc, ln, rn, order, lb, rb]
            if lc.len() == 1
                && rc.len() == 1
                && ln.len() == 1
                && rn.len() == 1
                && *order == [0, ln[0], 1, rn[0]]
                && lb.is_empty()
                && rb.is_empty() =>
        {
            Some((lc[0], rc[0]))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_dimension_numbers() {
        assert_eq!(
            dot_contracting("[1], [0], [0], [1], [0, 0, 1, 1], [], []"),
            Some((1, 0))
        );
        assert_eq!(
            dot_contracting("[1], [1], [0], [0], [0, 0, 1, 0], [], []"),
            Some((1, 1))
        );
        assert_eq!(
            dot_contracting("[1], [0], [0], [1], [1, 1, 0, 0], [], []"),
            None
        );
    }
}
