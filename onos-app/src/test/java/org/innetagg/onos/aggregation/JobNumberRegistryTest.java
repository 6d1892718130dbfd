package org.innetagg.onos.aggregation;

import org.innetagg.onos.TestStorage;
import org.junit.Test;

import java.util.Optional;

import static org.innetagg.onos.aggregation.JobNumberService.Holder.AGGREGATION;
import static org.innetagg.onos.aggregation.JobNumberService.Holder.TRAFFIC_CLASS;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.fail;

/** Job numbers shared by the aggregation and traffic-class resources. */
public class JobNumberRegistryTest {
    private final JobNumberRegistry numbers = TestTopology.numbers(new TestStorage());

    @Test
    public void aJobKeepsItsNumberAndANewJobGetsTheLowestFree() throws Exception {
        assertEquals(0, numbers.acquire("a", AGGREGATION));
        assertEquals(1, numbers.acquire("b", TRAFFIC_CLASS));
        assertEquals(2, numbers.acquire("c", AGGREGATION));
        assertEquals(1, numbers.acquire("b", AGGREGATION));
        assertEquals(1, numbers.acquire("b", AGGREGATION));
        numbers.release("a", AGGREGATION);
        assertEquals(Optional.empty(), numbers.number("a"));
        assertEquals(0, numbers.acquire("d", TRAFFIC_CLASS));
        assertEquals(3, numbers.acquire("e", TRAFFIC_CLASS));
    }

    @Test
    public void theNumberIsFreedOnlyWhenBothHoldersAreGone() throws Exception {
        numbers.acquire("x", AGGREGATION);
        assertEquals(1, numbers.acquire("job", TRAFFIC_CLASS));
        assertEquals(1, numbers.acquire("job", AGGREGATION));
        numbers.release("job", TRAFFIC_CLASS);
        assertEquals(Optional.of(1), numbers.number("job"));
        numbers.release("job", TRAFFIC_CLASS);  // twice: still held by its placement
        assertEquals(Optional.of(1), numbers.number("job"));
        assertEquals(2, numbers.acquire("other", TRAFFIC_CLASS));
        numbers.release("job", AGGREGATION);
        assertEquals(Optional.empty(), numbers.number("job"));
        assertEquals(1, numbers.acquire("later", AGGREGATION));
    }

    @Test
    public void releaseAllLetsGoOfOneHolderOnly() throws Exception {
        numbers.acquire("both", AGGREGATION);
        numbers.acquire("both", TRAFFIC_CLASS);
        numbers.acquire("agg-only", AGGREGATION);
        numbers.acquire("class-only", TRAFFIC_CLASS);
        numbers.releaseAll(AGGREGATION);
        assertEquals(Optional.of(0), numbers.number("both"));
        assertEquals(Optional.empty(), numbers.number("agg-only"));
        assertEquals(Optional.of(2), numbers.number("class-only"));
        assertEquals(1, numbers.acquire("new", AGGREGATION));
    }

    @Test
    public void allNumbersInUseIs503AndAJobWithANumberStillGetsIt() throws Exception {
        assertEquals(256, JobNumberRegistry.JOB_NUMBERS);
        for (int n = 0; n < JobNumberRegistry.JOB_NUMBERS; n++) {
            assertEquals(n, numbers.acquire("j" + n, AGGREGATION));
        }
        try {
            numbers.acquire("one-too-many", TRAFFIC_CLASS);
            fail("a 257th job got a number");
        } catch (InvalidPlacementException e) {
            assertEquals(503, e.status());
            assertEquals("job: all 256 job numbers are in use", e.getMessage());
        }
        assertEquals(Optional.empty(), numbers.number("one-too-many"));
        assertEquals(17, numbers.acquire("j17", TRAFFIC_CLASS));
        numbers.release("j200", AGGREGATION);
        assertEquals(200, numbers.acquire("one-too-many", TRAFFIC_CLASS));
    }
}
