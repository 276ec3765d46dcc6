//! A plan as text (for terminals), JSON (for tools) and SVG (for people reading the paper).
//! Under a mask each also shows the blocks the plan leaves out (nothing in them is visible).

use super::parts::{Pass, Payload, Role, Step, Task, Transfer};
use super::plans::Plan;
use serde::Serialize;
use serde_json::{Value, json};
use std::fmt::Write;

/// One line of a transfer, tagged with when it moves relative to the step's compute.
#[derive(Serialize)]
struct Move<'a> {
    #[serde(flatten)]
    transfer: &'a Transfer,
    phase: &'static str,
}

fn moves_per_step(plan: &Plan) -> Vec<Vec<Move<'_>>> {
    plan.steps
        .iter()
        .map(|s| {
            let fetch = s.fetches.iter().map(|t| Move {
                transfer: t,
                phase: "fetch",
            });
            let ret = s.returns.iter().map(|t| Move {
                transfer: t,
                phase: "return",
            });
            fetch.chain(ret).collect()
        })
        .collect()
}

/// JSON with the tasks of each step, the forward and backward transfers of each step, and the
/// cost-model figures. `forward` and `backward` are the two passes of the same schedule.
pub fn to_json(forward: &Plan, backward: &Plan) -> Value {
    let tasks: Vec<_> = forward.steps.iter().map(|s| &s.tasks).collect();
    json!({
        "workers": forward.workers,
        "schedule": forward.schedule,
        "steps": tasks,
        "transfers": moves_per_step(forward),
        "backward_transfers": moves_per_step(backward),
        "ideal_speedup": forward.ideal_speedup(),
        "idle_fraction": forward.idle_fraction(),
        "busy_fraction": forward.busy_fractions(),
        "makespan": forward.makespan(),
        "total_work": forward.total_work(),
        "mask": {
            "doc_lens": forward.mask.doc_lens(),
            "window": forward.mask.window(),
            "global": forward.mask.global(),
        },
        "skipped_blocks": forward.skipped_blocks(),
    })
}

fn payload_name(p: Payload) -> &'static str {
    match p {
        Payload::KeyValue => "K/V",
        Payload::Query => "Q",
        Payload::PartialOut => "O,LSE",
        Payload::QueryGradInputs => "Q,dO,LSE,D",
        Payload::KvGrad => "dK,dV",
        Payload::QueryGrad => "dQ",
    }
}

fn headline(plan: &Plan) -> String {
    let mask = if plan.mask.is_causal() {
        String::new()
    } else {
        format!(
            " under {} ({} blocks skipped)",
            plan.mask,
            plan.skipped_blocks().len()
        )
    };
    format!(
        "{} schedule, {} workers{mask}: {} steps, ideal speedup {:.2}x over one worker, idle {:.1}%",
        plan.schedule,
        plan.workers,
        plan.steps.len(),
        plan.ideal_speedup(),
        100.0 * plan.idle_fraction()
    )
}

/// "Q2·KV0, Q3·KV1": blocks by their chunks.
fn block_list(blocks: &[(usize, usize)]) -> String {
    let names: Vec<String> = blocks.iter().map(|(i, j)| format!("Q{i}·KV{j}")).collect();
    names.join(", ")
}

/// A table of steps × workers ("Q3·KV1", `*` marking a helper) followed by each step's moves.
pub fn to_text(plan: &Plan) -> String {
    let mut out = headline(plan) + "\n\n";
    let width = 14;
    let _ = write!(out, "{:<6}", "step");
    for w in 0..plan.workers {
        let _ = write!(out, "{:<width$}", format!("w{w}"));
    }
    out.push('\n');
    for (t, step) in plan.steps.iter().enumerate() {
        let _ = write!(out, "{t:<6}");
        for tasks in tasks_by_worker(plan, step) {
            let cell = match cell(plan, &tasks) {
                Some(c) => format!("{}{}", c.label, if c.helper { "*" } else { "" }),
                None => "-".into(),
            };
            let _ = write!(out, "{cell:<width$}");
        }
        out.push('\n');
    }
    out.push_str(
        "\n* helper: computes another worker's queries with its own K/V and returns the result\n",
    );
    let skipped = plan.skipped_blocks();
    if !skipped.is_empty() {
        let _ = writeln!(
            out,
            "\nskipped (the mask hides every pair; neither computed nor fetched): {}",
            block_list(&skipped)
        );
    }
    let pass = match plan.pass {
        Pass::Forward => "forward",
        Pass::Backward => "backward",
    };
    let _ = writeln!(
        out,
        "\n{pass} transfers (fetches are issued one step early):"
    );
    for (t, (step, moves)) in plan.steps.iter().zip(moves_per_step(plan)).enumerate() {
        let list: Vec<String> = moves
            .iter()
            .map(|m| {
                let tr = m.transfer;
                format!(
                    "{}{} w{}→w{} ({})",
                    payload_name(tr.payload),
                    tr.chunk,
                    tr.from,
                    tr.to,
                    m.phase
                )
            })
            .collect();
        if !step.fetches.is_empty() || !step.returns.is_empty() {
            let _ = writeln!(out, "  step {t}: {}", list.join(", "));
        }
    }
    out
}

/// What a worker does at one step, for display.
struct Cell {
    /// "Q3·KV1", or "Q1,6·KV0" for several blocks.
    label: String,
    /// Whose queries it serves (the owner of the query chunks).
    serves: usize,
    /// True when it computes another worker's queries.
    helper: bool,
}

/// Each worker's tasks at `step`, gathered in one pass over them: looking each worker's up
/// separately made rendering cubic in the workers.
fn tasks_by_worker(plan: &Plan, step: &Step) -> Vec<Vec<Task>> {
    let mut by = vec![Vec::new(); plan.workers];
    for t in &step.tasks {
        by[t.worker].push(*t);
    }
    by
}

fn cell(plan: &Plan, tasks: &[Task]) -> Option<Cell> {
    let first = tasks.first()?;
    let list = |pick: fn(&Task) -> usize| {
        let mut v: Vec<usize> = tasks.iter().map(pick).collect();
        v.sort();
        v.dedup();
        v.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    Some(Cell {
        label: format!("Q{}·KV{}", list(|t| t.q_chunk), list(|t| t.kv_chunk)),
        serves: plan.owner[first.q_chunk],
        helper: plan.role(first) == Role::Helper,
    })
}

/// Colour of query chunk `q` of `p`: one hue per chunk, so a helper's cell has the colour of
/// the worker it serves.
fn chunk_colour(q: usize, p: usize) -> String {
    format!("hsl({}, 70%, 78%)", (q * 360) / p.max(1))
}

fn arrow_colour(p: Payload) -> &'static str {
    match p {
        Payload::KeyValue | Payload::KvGrad => "#1f5fbf",
        Payload::Query | Payload::QueryGradInputs => "#2e8b3a",
        Payload::PartialOut | Payload::QueryGrad => "#d0661c",
    }
}

/// Workers as rows, steps as columns. Each cell is coloured by the query chunk it serves and
/// labelled with its block; helper cells have a dashed border. Arrows in a column show that
/// step's transfers: fetches on the cell's left edge, returns on its right.
pub fn to_svg(plan: &Plan) -> String {
    let (cw, ch, left, top, margin) = (150.0, 44.0, 60.0, 60.0, 28.0);
    let width = (left + cw * plan.steps.len() as f64 + 40.0).max(880.0);
    let grid_top = top + ch * plan.workers as f64 + 90.0;
    let side = (360.0 / plan.chunks() as f64).clamp(6.0, 28.0);
    let grid = !plan.mask.is_causal();
    let height = if grid {
        grid_top + 40.0 + side * plan.chunks() as f64 + 20.0
    } else {
        grid_top
    };
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">
<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="context-stroke"/></marker></defs>
<rect width="100%" height="100%" fill="white"/>
<text x="{left}" y="22" font-size="14" font-weight="bold">{}</text>
"#,
        headline(plan)
    );
    let y_mid = |w: usize| top + ch * w as f64 + ch / 2.0;
    for w in 0..plan.workers {
        let _ = writeln!(
            s,
            r#"<text x="10" y="{}" dominant-baseline="middle">worker {w}</text>"#,
            y_mid(w)
        );
    }
    for (t, step) in plan.steps.iter().enumerate() {
        let x = left + cw * t as f64;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">step {t}</text>"#,
            x + cw / 2.0,
            top - 8.0
        );
        for (w, tasks) in tasks_by_worker(plan, step).iter().enumerate() {
            let y = top + ch * w as f64;
            let (fill, stroke, dash, label, ink) = match cell(plan, tasks) {
                Some(c) => (
                    chunk_colour(c.serves, plan.workers),
                    "#333",
                    if c.helper { "5,3" } else { "none" },
                    if c.helper {
                        format!("{} → w{}", c.label, c.serves)
                    } else {
                        c.label
                    },
                    "#000",
                ),
                None => ("#f2f2f2".into(), "#ccc", "none", "idle".into(), "#999"),
            };
            let _ = writeln!(
                s,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{fill}" stroke="{stroke}" stroke-dasharray="{dash}"/><text x="{}" y="{}" text-anchor="middle" dominant-baseline="middle" fill="{ink}">{label}</text>"#,
                x + margin,
                y + 4.0,
                cw - 2.0 * margin,
                ch - 8.0,
                x + cw / 2.0,
                y + ch / 2.0
            );
        }
        // Spread a step's arrows across the cell margins so they do not hide each other.
        let spread = |k: usize, n: usize| (k as f64 + 0.5) * margin / n.max(1) as f64;
        let (nf, nr) = (step.fetches.len(), step.returns.len());
        let fetches = step
            .fetches
            .iter()
            .enumerate()
            .map(|(k, tr)| (tr, x + spread(k, nf)));
        let returns = step
            .returns
            .iter()
            .enumerate()
            .map(|(k, tr)| (tr, x + cw - spread(k, nr)));
        let arrows = fetches.chain(returns);
        for (tr, ax) in arrows {
            let _ = writeln!(
                s,
                r#"<line x1="{ax}" y1="{}" x2="{ax}" y2="{}" stroke="{}" stroke-width="1.5" marker-end="url(#head)"/>"#,
                y_mid(tr.from),
                y_mid(tr.to),
                arrow_colour(tr.payload)
            );
        }
    }
    let ly = top + ch * plan.workers as f64 + 30.0;
    let legend = [
        (Payload::KeyValue, "K/V fetched by an owner (left edge)"),
        (Payload::Query, "Q fetched by a helper (left edge)"),
        (Payload::PartialOut, "partial O, LSE returned (right edge)"),
    ];
    for (k, (p, text)) in legend.iter().enumerate() {
        let lx = left + 270.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2" marker-end="url(#head)"/><text x="{}" y="{}" dominant-baseline="middle">{text}</text>"#,
            lx + 24.0,
            arrow_colour(*p),
            lx + 30.0,
            ly
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="{}">Cell colour = whose queries it serves; dashed = a helper working for another worker.</text>"#,
        ly + 28.0
    );
    if grid {
        block_grid(&mut s, plan, left, grid_top, side);
    }
    s.push_str("</svg>\n");
    s
}

/// The chunk-by-chunk block matrix of a masked plan below its schedule: computed blocks shaded
/// by their cost, skipped ones crossed out, blocks above the diagonal (causal) left blank.
fn block_grid(s: &mut String, plan: &Plan, left: f64, top: f64, cell: f64) {
    let n = plan.chunks();
    let skipped = plan.skipped_blocks();
    let costs: Vec<(Task, f64)> = plan
        .steps
        .iter()
        .flat_map(|st| st.tasks.iter().map(|t| (*t, plan.task_cost(t))))
        .collect();
    let most = costs
        .iter()
        .map(|c| c.1)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="{}">Blocks (query chunk down, key chunk across): shaded by visible pairs, crossed out when the mask hides all of them ({} skipped: {}).</text>"#,
        top + 14.0,
        skipped.len(),
        if skipped.len() > 12 {
            format!("{} …", block_list(&skipped[..12]))
        } else {
            block_list(&skipped)
        }
    );
    let top = top + 30.0;
    for i in 0..n {
        for j in 0..=i {
            let (x, y) = (left + cell * j as f64, top + cell * i as f64);
            let cost = costs
                .iter()
                .find(|(t, _)| (t.q_chunk, t.kv_chunk) == (i, j))
                .map(|c| c.1);
            match cost {
                Some(c) => {
                    let light = 92.0 - 50.0 * (c / most);
                    let _ = writeln!(
                        s,
                        r##"<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="hsl(215, 60%, {light:.0}%)" stroke="#fff"><title>Q{i}·KV{j}: cost {c:.3}</title></rect>"##
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        r##"<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="#fff" stroke="#ddd"><title>Q{i}·KV{j}: skipped</title></rect><path d="M{x},{y} l{cell},{cell} M{},{y} l-{cell},{cell}" stroke="#c33" stroke-width="1"/>"##,
                        x + cell
                    );
                }
            }
        }
    }
}
