// The overlay's scripts run against a stand-in of the ONOS 2.7 GUI services they use
// (angular.module, TopoOverlayService, WebSocketService, PanelService, FlashService,
// $timeout, d3.select). A stand-in: ONOS's GUI cannot run here, so this checks our scripts'
// logic and the calls they make, not that ONOS's real services accept them.
//
// Run: node --test onos-app/src/test/js/ (OverlayScriptTest runs it from mvn test, pointing
// INNETAGG_VIEW_DIR at the scripts as built into target/classes).

'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const vm = require('node:vm');

const VIEW_DIR = process.env.INNETAGG_VIEW_DIR ||
    path.join(__dirname, '..', '..', 'main', 'resources', 'app', 'view', 'innetAggTopov');

// Keys ONOS 2.7's topology view keeps for itself (topoToolbar.js "prohibited" and its key
// to button map, topo.js actionMap): an overlay binding one of them is ignored or clashes.
const TOPO_KEYS = ['T', 'backSlash', 'slash', 'X', 'O', 'I', 'D', 'H', 'M', 'P', 'B', 'G', 'S', 'Z',
    'N', 'L', 'R', 'E', 'U', 'dash', 'dot', 'esc', 'shift-L', 'alt-L', 'F1', 'F2', 'F3', 'F4', 'F5'];

// Objects made inside the vm context have that context's prototypes: compare plain copies.
const plain = (x) => JSON.parse(JSON.stringify(x));

// A d3-like element: just what the panel rendering uses.
function element(tag) {
    const el = {
        tag, children: [], classes: new Set(), attrs: {}, textValue: '', handlers: {},
        append(t) { const c = element(t); el.children.push(c); return c; },
        classed(c, on) { if (on) { el.classes.add(c); } else { el.classes.delete(c); } return el; },
        text(t) { el.textValue = String(t); return el; },
        attr(k, v) { el.attrs[k] = v; return el; },
        on(evt, fn) { el.handlers[evt] = fn; return el; },
        find(pred) {
            const out = [];
            (function walk(e) { if (pred(e)) { out.push(e); } e.children.forEach(walk); })(el);
            return out;
        },
    };
    return el;
}

function gui({ topoShown = true } = {}) {
    const modules = {};
    const g = {
        sent: [], flashes: [], bound: null, overlay: null, panels: {}, timers: new Map(), nextTimer: 1,
        topoShown,
    };
    const angular = {
        module(name, deps) {
            if (deps) {
                modules[name] = { factories: {}, runs: [] };
            }
            const m = modules[name];
            if (!m) {
                throw new Error('module ' + name + ' used before it is defined');
            }
            const api = {
                factory(n, spec) { m.factories[n] = spec; return api; },
                run(spec) { m.runs.push(spec); return api; },
            };
            return api;
        },
    };
    const $timeout = (fn, ms) => { const id = g.nextTimer++; g.timers.set(id, { fn, ms }); return id; };
    $timeout.cancel = (id) => g.timers.delete(id);
    const services = {
        $log: { debug() {}, warn() {} },
        $timeout,
        FlashService: { flash(m) { g.flashes.push(m); } },
        WebSocketService: {
            sendEvent(e, p) { g.sent.push(p === undefined ? [e] : [e, p]); },
            bindHandlers(h) { assert.equal(g.bound, null, 'handlers bound twice'); g.bound = h; },
            unbindHandlers(h) { assert.equal(h, g.bound); g.bound = null; },
        },
        PanelService: {
            createPanel(id, opts) {
                assert.ok(!g.panels[id], 'panel created twice');
                const root = element('div');
                let visible = false;
                g.panels[id] = {
                    root, opts,
                    empty() { root.children = []; },
                    append(t) { return root.append(t); },
                    isVisible() { return visible; },
                    show() { visible = true; },
                    hide() { visible = false; },
                    classed(c, on) { return root.classed(c, on); },
                };
                return g.panels[id];
            },
            destroyPanel(id) { delete g.panels[id]; },
        },
        TopoOverlayService: { register(o) { g.overlay = o; } },
    };
    const d3 = { select(sel) { return { empty: () => !(sel === '#ov-topo' && g.topoShown) }; } };
    const ctx = vm.createContext({ angular, d3 });
    for (const f of ['innetAggTopov.js', 'innetAggTopovOverlay.js']) { // the order of js.html
        vm.runInContext(fs.readFileSync(path.join(VIEW_DIR, f), 'utf8'), ctx, { filename: f });
    }
    // What Angular would do: build the factory, then run the module's run blocks.
    const inject = (spec, extra) => {
        const names = spec.slice(0, -1);
        return spec[spec.length - 1](...names.map(n => extra[n] || services[n]));
    };
    const mod = modules.ovInnetAggTopov;
    assert.ok(mod, 'module ovInnetAggTopov not defined');
    const svc = inject(mod.factories.InnetAggTopovService, {});
    mod.runs.forEach(r => inject(r, { InnetAggTopovService: svc }));
    g.svc = svc;
    g.panel = () => g.panels['innet-agg-job-panel'];
    g.events = () => g.sent.map(s => s[0]);
    g.fire = (event, payload) => g.bound[event](payload);
    g.tick = () => { const [id, t] = [...g.timers][0]; g.timers.delete(id); t.fn(); };
    return g;
}

const JOB = {
    jobs: ['bert-b', 'resnet-a'],
    job: 'resnet-a',
    panel: {
        title: 'resnet-a', glyphId: 'm_topo', id: 'resnet-a',
        propOrder: ['p4JobId', 'workers', '-', 'agg0'],
        propLabels: { p4JobId: 'P4 job id', workers: 'Workers', '-': '-', agg0: 'device:leaf1' },
        propValues: { p4JobId: '0', workers: '3', '-': '', agg0: 'fan-in 2, slots [0, 128) → device:leaf2' },
        buttons: [],
    },
};

test('registers the overlay under the id the Java side uses, with free keys', () => {
    const g = gui();
    const java = fs.readFileSync(path.join(__dirname, '..', '..', 'main', 'java', 'org', 'innetagg', 'onos',
        'ui', 'AggregationTopoOverlay.java'), 'utf8');
    assert.equal(g.overlay.overlayId, java.match(/OVERLAY_ID = "([^"]+)"/)[1]);
    const kb = g.overlay.keyBindings;
    assert.deepEqual(plain(kb._keyOrder), ['V', 'leftArrow', 'rightArrow', '0']);
    for (const k of kb._keyOrder) {
        assert.ok(!TOPO_KEYS.includes(k), k + ' is a topology view key');
        assert.equal(typeof kb[k].cb, 'function');
        assert.ok(kb[k].tt && kb[k].gid);
    }
    assert.equal(g.overlay.glyphId, '*funnel');
    assert.ok(g.overlay.glyphs.funnel.d);
});

test('activating asks for the jobs; keys send next, previous and show', () => {
    const g = gui();
    g.overlay.activate();
    assert.deepEqual(Object.keys(g.bound).sort(), ['innetAggError', 'innetAggJob']);
    assert.ok(g.panel(), 'panel created');
    assert.deepEqual(g.events(), ['innetAggStart']);
    const kb = g.overlay.keyBindings;
    kb.rightArrow.cb();
    kb.leftArrow.cb();
    kb.V.cb();
    assert.deepEqual(g.events(), ['innetAggStart', 'innetAggNext', 'innetAggPrev', 'innetAggShow']);
});

test('a job message fills the panel; a click on a job selects it', () => {
    const g = gui();
    g.overlay.activate();
    g.fire('innetAggJob', JOB);
    const root = g.panel().root;
    assert.ok(g.panel().isVisible());
    assert.equal(root.find(e => e.tag === 'h2')[0].textValue, 'resnet-a');
    const rows = root.find(e => e.tag === 'tr');
    assert.equal(rows.length, 4);
    const cells = rows.map(r => r.children.map(c => c.textValue));
    assert.deepEqual(cells[0], ['P4 job id', '0']);
    assert.deepEqual(cells[3], ['device:leaf1', 'fan-in 2, slots [0, 128) → device:leaf2']);
    assert.equal(rows[2].find(e => e.tag === 'hr').length, 1, 'separator');
    const jobs = root.find(e => e.classes.has('job'));
    assert.deepEqual(jobs.map(j => j.textValue), ['bert-b', 'resnet-a']);
    assert.deepEqual(jobs.map(j => j.classes.has('current')), [false, true]);
    jobs[0].handlers.click();
    assert.deepEqual(plain(g.sent[g.sent.length - 1]), ['innetAggSelect', { job: 'bert-b' }]);
});

test('no job shown: the panel says how to show one; ESC is not consumed', () => {
    const g = gui();
    g.overlay.activate();
    g.fire('innetAggJob', { jobs: ['a'], job: null, panel: null });
    assert.match(g.panel().root.find(e => e.tag === 'p')[0].textValue, /No job shown/);
    assert.equal(g.overlay.hooks.escape(), false);
    assert.deepEqual(g.events(), ['innetAggStart']);
    g.fire('innetAggJob', { jobs: [], job: null, panel: null, message: "job 'a' is no longer placed" });
    assert.match(g.panel().root.find(e => e.tag === 'p')[0].textValue, /No jobs are placed/);
    assert.deepEqual(g.flashes, ["job 'a' is no longer placed"]);
});

test('ESC with a job shown clears it and is consumed', () => {
    const g = gui();
    g.overlay.activate();
    g.fire('innetAggJob', JOB);
    assert.equal(g.overlay.hooks.escape(), true);
    assert.deepEqual(g.events(), ['innetAggStart', 'innetAggClear']);
    assert.equal(g.overlay.hooks.escape(), false);
});

test('errors are flashed', () => {
    const g = gui();
    g.overlay.activate();
    g.fire('innetAggError', { message: "no placement for job 'x'" });
    assert.deepEqual(g.flashes, ["no placement for job 'x'"]);
});

test('refreshes while the topology view is shown, stops by itself when it is gone', () => {
    const g = gui();
    g.overlay.activate();
    assert.equal(g.timers.size, 1);
    assert.equal([...g.timers.values()][0].ms, 2000);
    g.tick();
    assert.deepEqual(g.events(), ['innetAggStart', 'innetAggRefresh']);
    assert.equal(g.timers.size, 1, 'rescheduled');
    g.topoShown = false;
    g.tick();
    assert.deepEqual(g.events(), ['innetAggStart', 'innetAggRefresh', 'innetAggStop']);
    assert.equal(g.timers.size, 0);
    assert.equal(g.bound, null);
    assert.equal(g.panel(), undefined);
});

test('deactivating stops: clears on the server, unbinds, removes the panel and the timer', () => {
    const g = gui();
    g.overlay.activate();
    g.overlay.deactivate();
    assert.deepEqual(g.events(), ['innetAggStart', 'innetAggStop']);
    assert.equal(g.bound, null);
    assert.equal(g.panel(), undefined);
    assert.equal(g.timers.size, 0);
    g.overlay.deactivate();
    assert.deepEqual(g.events(), ['innetAggStart', 'innetAggStop'], 'a second stop sends nothing');
    g.overlay.activate();
    assert.ok(g.panel());
    assert.equal(g.timers.size, 1);
});
