/*
 innet-agg topology overlay -- registration with ONOS's topology view: toolbar button,
 overlay buttons with their keys, ESC. The work is done by InnetAggTopovService.
 */

(function () {
    'use strict';

    var svc;

    var overlay = {
        // must match AggregationTopoOverlay.OVERLAY_ID (checked by a test)
        overlayId: 'innet-agg-overlay',
        glyphId: '*funnel',
        tooltip: 'innet-agg: aggregation placements',

        // installed as 'innet-agg-overlay-funnel'
        glyphs: {
            funnel: {
                vb: '0 0 8 8',
                d: 'M1,1h6l-2,3v3h-2v-3z',
            },
        },

        activate: function () {
            svc.start();
        },
        deactivate: function () {
            svc.stop();
        },

        // Topology-view keys are taken (O I D H M P B G S Z N L R E T X / \): these are free.
        keyBindings: {
            V: {
                cb: function () { svc.show(); },
                tt: 'Show the selected job (else the first)',
                gid: 'm_details',
            },
            leftArrow: {
                cb: function () { svc.prev(); },
                tt: 'Previous job',
                gid: 'm_prev',
            },
            rightArrow: {
                cb: function () { svc.next(); },
                tt: 'Next job',
                gid: 'm_next',
            },
            0: {
                cb: function () { svc.clear(); },
                tt: 'Clear the job highlights',
                gid: 'm_xMark',
            },

            _keyOrder: ['V', 'leftArrow', 'rightArrow', '0'],
        },

        hooks: {
            // true consumes ESC: only when a job was shown
            escape: function () {
                return svc.clear();
            },
        },
    };

    angular.module('ovInnetAggTopov')
        .run(['TopoOverlayService', 'InnetAggTopovService',

        function (tov, _svc_) {
            svc = _svc_;
            tov.register(overlay);
        }]);
}());
