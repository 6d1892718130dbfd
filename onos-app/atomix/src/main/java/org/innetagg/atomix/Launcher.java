package org.innetagg.atomix;

import io.atomix.cluster.Node;
import io.atomix.cluster.discovery.BootstrapDiscoveryProvider;
import io.atomix.core.Atomix;
import io.atomix.protocols.raft.partition.RaftPartitionGroup;

import java.io.File;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;

/**
 * One Atomix 3.1.9 storage node of an ONOS 2.7 cluster: the Raft groups ONOS's consistent
 * maps, counters and leader elections live in ("system" for management, "raft" for data),
 * as ONOS's own deployments run them on Atomix's agent.
 *
 * <pre>
 * java -jar innet-agg-atomix.jar --cluster onos --id atomix-1 --address 10.0.0.1:5679 \
 *     --members atomix-1@10.0.0.1:5679,atomix-2@10.0.0.2:5679,atomix-3@10.0.0.3:5679 \
 *     --data /var/lib/atomix [--partitions 3]
 * </pre>
 *
 * The cluster name must be the ONOS cluster.json's "name"; ONOS nodes join as clients of
 * these members (cluster.json "storage"). Stops cleanly on SIGTERM.
 */
public final class Launcher {
    private Launcher() {
    }

    public static void main(String[] args) throws Exception {
        String cluster = "onos";
        String id = null;
        String address = null;
        String members = null;
        String data = null;
        int partitions = 3;
        for (int i = 0; i < args.length; i++) {
            String value = i + 1 < args.length ? args[i + 1] : null;
            switch (args[i]) {
                case "--cluster": cluster = need(args[i], value); i++; break;
                case "--id": id = need(args[i], value); i++; break;
                case "--address": address = need(args[i], value); i++; break;
                case "--members": members = need(args[i], value); i++; break;
                case "--data": data = need(args[i], value); i++; break;
                case "--partitions": partitions = Integer.parseInt(need(args[i], value)); i++; break;
                default: fail("unknown option " + args[i]);
            }
        }
        if (id == null || address == null || members == null || data == null) {
            fail("--id, --address, --members and --data are required");
        }
        List<Node> nodes = new ArrayList<>();
        List<String> ids = new ArrayList<>();
        for (String m : members.split(",")) {
            String[] parts = m.trim().split("@", 2);
            if (parts.length != 2) {
                fail("--members: " + m + " is not id@host:port");
            }
            String[] hp = hostPort(parts[1]);
            nodes.add(Node.builder().withId(parts[0]).withHost(hp[0])
                    .withPort(Integer.parseInt(hp[1])).build());
            ids.add(parts[0]);
        }
        if (!ids.contains(id)) {
            fail("--id " + id + " is not one of --members");
        }
        String[] own = hostPort(address);
        File dir = new File(data);
        Atomix atomix = Atomix.builder()
                .withClusterId(cluster)
                .withMemberId(id)
                .withHost(own[0])
                .withPort(Integer.parseInt(own[1]))
                .withMembershipProvider(BootstrapDiscoveryProvider.builder().withNodes(nodes).build())
                .withManagementGroup(RaftPartitionGroup.builder("system")
                        .withNumPartitions(1)
                        .withMembers(ids)
                        .withDataDirectory(new File(dir, "system"))
                        .build())
                .withPartitionGroups(RaftPartitionGroup.builder("raft")
                        .withNumPartitions(partitions)
                        .withPartitionSize(ids.size())
                        .withMembers(ids)
                        .withDataDirectory(new File(dir, "raft"))
                        .build())
                .build();
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            atomix.stop().join();
            stopped.countDown();
        }));
        atomix.start().join();
        // The line the tests and compose's health check wait for
        System.out.println("atomix " + id + " ready: " + ids.size() + " members");
        System.out.flush();
        stopped.await();
    }

    private static String[] hostPort(String s) {
        int colon = s.lastIndexOf(':');
        if (colon <= 0) {
            fail(s + " is not host:port");
        }
        return new String[] {s.substring(0, colon), s.substring(colon + 1)};
    }

    private static String need(String option, String value) {
        if (value == null) {
            fail(option + " needs a value");
        }
        return value;
    }

    private static void fail(String message) {
        System.err.println("innet-agg-atomix: " + message);
        System.exit(2);
    }
}
