package org.innetagg.onos.owner;

import org.innetagg.onos.TestStorage;
import org.junit.Test;

import java.util.concurrent.Callable;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

/** The owner claim across a cluster's nodes (managers sharing one {@link TestStorage}). */
public class OwnerManagerTest {
    private final TestStorage storage = new TestStorage();
    private final AtomicLong now = new AtomicLong(1_000_000);

    private OwnerManager node() {
        OwnerManager m = new OwnerManager();
        m.storageService = storage;
        m.clock = now::get;
        m.activate();
        return m;
    }

    @Test
    public void anotherOwnerIsRefusedUntilTheClaimExpiresAndReplicasShareIt() throws Exception {
        OwnerManager a = node();
        OwnerManager b = node();
        a.claim("store-a", "host:1", 30_000);
        try {
            b.claim("store-b", "host:2", 30_000);
            throw new AssertionError("a second owner's claim accepted");
        } catch (OwnerService.Taken e) {
            assertTrue(e.getMessage(), e.getMessage().contains("'store-a'") && e.getMessage().contains("'host:1'"));
        }
        // A replica of the same database renews it.
        assertEquals("host:3", b.claim("store-a", "host:3", 30_000).holder);
        assertEquals("store-a", a.current().orElseThrow().owner);
        now.addAndGet(30_001);
        assertFalse(a.current().isPresent());
        assertEquals("store-b", b.claim("store-b", "host:2", 30_000).owner);
        assertFalse(a.release("store-a"));
        assertTrue(a.release("store-b"));
        assertFalse(b.current().isPresent());
    }

    @Test
    public void twoOwnersClaimingAtOnceOnTwoNodesNeverBothWin() throws Exception {
        OwnerManager a = node();
        OwnerManager b = node();
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            for (int round = 0; round < 300; round++) {
                CyclicBarrier start = new CyclicBarrier(2);
                Callable<Boolean> one = () -> {
                    start.await();
                    try {
                        a.claim("store-a", "h:1", 30_000);
                        return true;
                    } catch (OwnerService.Taken e) {
                        return false;
                    }
                };
                Callable<Boolean> two = () -> {
                    start.await();
                    try {
                        b.claim("store-b", "h:2", 30_000);
                        return true;
                    } catch (OwnerService.Taken e) {
                        return false;
                    }
                };
                Future<Boolean> x = pool.submit(one);
                Future<Boolean> y = pool.submit(two);
                assertTrue("round " + round, x.get(60, TimeUnit.SECONDS) ^ y.get(60, TimeUnit.SECONDS));
                assertTrue(a.release(a.current().orElseThrow().owner));
            }
        } finally {
            pool.shutdownNow();
        }
    }
}
