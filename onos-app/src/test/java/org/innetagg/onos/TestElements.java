package org.innetagg.onos;

import com.google.common.collect.ImmutableSet;
import org.onlab.packet.ChassisId;
import org.onlab.packet.IpAddress;
import org.onlab.packet.VlanId;
import org.onosproject.net.ConnectPoint;
import org.onosproject.net.DefaultAnnotations;
import org.onosproject.net.DefaultDevice;
import org.onosproject.net.DefaultHost;
import org.onosproject.net.DefaultLink;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.Host;
import org.onosproject.net.HostId;
import org.onosproject.net.HostLocation;
import org.onosproject.net.Link;
import org.onosproject.net.PortNumber;
import org.onosproject.net.provider.ProviderId;

/** The network elements the tests' topologies are made of, built the one way ONOS would. */
public final class TestElements {
    public static final ProviderId PID = new ProviderId("test", "innet-agg");

    private TestElements() {
    }

    /** A switch, with annotations given as key, value, key, value... */
    public static Device device(DeviceId id, String... annotations) {
        DefaultAnnotations.Builder a = DefaultAnnotations.builder();
        for (int i = 0; i < annotations.length; i += 2) {
            a.set(annotations[i], annotations[i + 1]);
        }
        return new DefaultDevice(PID, id, Device.Type.SWITCH, "test", "1", "1", "1", new ChassisId(),
                a.build());
    }

    /** A directed, active link a:pa -> b:pb. */
    public static Link link(DeviceId a, long pa, DeviceId b, long pb) {
        return DefaultLink.builder().providerId(PID)
                .src(new ConnectPoint(a, PortNumber.portNumber(pa)))
                .dst(new ConnectPoint(b, PortNumber.portNumber(pb)))
                .type(Link.Type.DIRECT).state(Link.State.ACTIVE).build();
    }

    /** A host on device `at`, port `port`; its MAC is the one in its id. */
    public static Host host(HostId id, DeviceId at, long port, IpAddress... ips) {
        return new DefaultHost(PID, id, id.mac(), VlanId.NONE,
                new HostLocation(at, PortNumber.portNumber(port), 0), ImmutableSet.copyOf(ips));
    }
}
