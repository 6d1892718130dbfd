/*
 innet-agg topology overlay -- the service behind the overlay's buttons and keys.

 Talks to org.innetagg.onos.ui.AggregationTopoMessageHandler over ONOS's GUI web socket:
 sends the innetAgg* requests below, receives 'innetAggJob' (job list, selected job and its
 panel as ONOS's PropertyPanel JSON) and 'innetAggError'; the highlights arrive as ONOS's own
 'showHighlights', which the topology view draws.
 */

(function () {
    'use strict';

    // injected refs
    var $log, $timeout, flash, wss, ps;

    // events the Java handler answers (AggregationTopoMessageHandler)
    var req = {
        start: 'innetAggStart',
        stop: 'innetAggStop',
        show: 'innetAggShow',
        select: 'innetAggSelect',
        next: 'innetAggNext',
        prev: 'innetAggPrev',
        clear: 'innetAggClear',
        refresh: 'innetAggRefresh',
    };

    var panelId = 'innet-agg-job-panel',
        // placements change through REST, not through this view: ask again this often
        refreshMs = 2000;

    // state while the overlay is active
    var handlers = null,
        panel = null,
        timer = null,
        jobs = [],
        current = null;

    // === server events

    function onJob(data) {
        jobs = data.jobs || [];
        current = data.job || null;
        render(data);
        if (data.message) {
            flash.flash(data.message);
        }
    }

    function onError(data) {
        $log.warn('innet-agg:', data.message);
        flash.flash(data.message);
    }

    // === panel

    function render(data) {
        var pp = data.panel,
            tbody, list;

        if (!panel) {
            return;
        }
        panel.empty();
        panel.append('h2').text(pp ? pp.title : 'Aggregation jobs');

        if (pp) {
            tbody = panel.append('table').append('tbody');
            pp.propOrder.forEach(function (key) {
                var tr = tbody.append('tr');
                if (key === '-') {
                    tr.append('td').attr('colspan', 2).append('hr');
                } else {
                    tr.append('td').classed('label', true).text(pp.propLabels[key]);
                    tr.append('td').classed('value', true).text(pp.propValues[key]);
                }
            });
        } else {
            panel.append('p').text(jobs.length ?
                'No job shown: V or the arrows show one.' : 'No jobs are placed.');
        }

        list = panel.append('div').classed('jobs', true);
        jobs.forEach(function (id) {
            list.append('div')
                .classed('job', true)
                .classed('current', id === current)
                .text(id)
                .on('click', function () { select(id); });
        });

        if (!panel.isVisible()) {
            panel.show();
        }
    }

    // === refresh

    function schedule() {
        timer = $timeout(tick, refreshMs);
    }

    function tick() {
        timer = null;
        if (!handlers) {
            return;
        }
        // ONOS deactivates no overlay when the user leaves the topology view: stop here then.
        if (d3.select('#ov-topo').empty()) {
            stop();
            return;
        }
        wss.sendEvent(req.refresh);
        schedule();
    }

    // === API for the overlay

    function start() {
        if (!handlers) {
            handlers = { innetAggJob: onJob, innetAggError: onError };
            wss.bindHandlers(handlers);
            panel = ps.createPanel(panelId, { edge: 'left', width: 260 });
        }
        if (!timer) {
            schedule();
        }
        wss.sendEvent(req.start);
    }

    function stop() {
        if (!handlers) {
            return;
        }
        if (timer) {
            $timeout.cancel(timer);
            timer = null;
        }
        wss.sendEvent(req.stop);
        wss.unbindHandlers(handlers);
        handlers = null;
        ps.destroyPanel(panelId);
        panel = null;
        jobs = [];
        current = null;
    }

    function show() {
        wss.sendEvent(req.show);
    }

    function select(id) {
        wss.sendEvent(req.select, { job: id });
    }

    function next() {
        wss.sendEvent(req.next);
    }

    function prev() {
        wss.sendEvent(req.prev);
    }

    // true when a job was shown (the overlay's ESC hook consumes the key then)
    function clear() {
        if (!current) {
            return false;
        }
        current = null;
        wss.sendEvent(req.clear);
        return true;
    }

    angular.module('ovInnetAggTopov', [])
        .factory('InnetAggTopovService',
        ['$log', '$timeout', 'FlashService', 'WebSocketService', 'PanelService',

        function (_$log_, _$timeout_, _flash_, _wss_, _ps_) {
            $log = _$log_;
            $timeout = _$timeout_;
            flash = _flash_;
            wss = _wss_;
            ps = _ps_;

            return {
                start: start,
                stop: stop,
                show: show,
                select: select,
                next: next,
                prev: prev,
                clear: clear,
                current: function () { return current; },
            };
        }]);
}());
