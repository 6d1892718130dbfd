"""The closed loop of `make demo`: a simulated fabric behind ONOS's REST API (`live`,
`onos_rest`, also the tests' stand-in for ONOS), INT over UDP to the collector, the
service's loop re-placing jobs (`closedloop`)."""
