package org.innetagg.onos.pipeconf;

import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.criteria.Criterion;
import org.onosproject.net.flow.criteria.PiCriterion;
import org.onosproject.net.flow.instructions.Instruction;
import org.onosproject.net.flow.instructions.PiInstruction;
import org.onosproject.net.pi.model.PiActionModel;
import org.onosproject.net.pi.model.PiActionParamModel;
import org.onosproject.net.pi.model.PiMatchFieldModel;
import org.onosproject.net.pi.model.PiPipelineModel;
import org.onosproject.net.pi.model.PiTableId;
import org.onosproject.net.pi.model.PiTableModel;
import org.onosproject.net.pi.runtime.PiAction;
import org.onosproject.net.pi.runtime.PiActionParam;
import org.onosproject.net.pi.runtime.PiExactFieldMatch;
import org.onosproject.net.pi.runtime.PiFieldMatch;
import org.onosproject.net.pi.runtime.PiTernaryFieldMatch;
import org.onlab.util.ImmutableByteSequence;

import java.math.BigInteger;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

/**
 * What ONOS's flow rule translator would check of a rule for our pipeline (its PI translation
 * lives in ONOS's core, which is not published for 2.7): the table exists, every field match is
 * one of its match fields with the right match type and fits its width, the action is one of
 * the table's with every parameter present and fitting, and a keyless table gets an empty
 * selector (its default action). What P4Runtime asks of a ternary entry too: no value bit
 * outside the mask, and a priority above 0.
 */
public final class PipelineModelCheck {
    private PipelineModelCheck() {
    }

    public static PiAction assertFits(FlowRule rule, PiPipelineModel model) {
        PiTableModel table = model.table((PiTableId) rule.table())
                .orElseThrow(() -> new AssertionError("no table " + rule.table()));
        if (table.matchFields().isEmpty()) {
            assertTrue(table.id() + " is keyless: its entry is the default action",
                    rule.selector().criteria().isEmpty());
        } else {
            assertEquals(1, rule.selector().criteria().size());
            Criterion c = rule.selector().criteria().iterator().next();
            assertEquals(Criterion.Type.PROTOCOL_INDEPENDENT, c.type());
            for (PiFieldMatch m : ((PiCriterion) c).fieldMatches()) {
                PiMatchFieldModel field = table.matchField(m.fieldId())
                        .orElseThrow(() -> new AssertionError(m.fieldId() + " is no match field of " + table.id()));
                assertEquals(m.fieldId() + " match type", field.matchType(), m.type());
                if (m instanceof PiExactFieldMatch) {
                    assertFitsWidth(m.fieldId().toString(), ((PiExactFieldMatch) m).value(), field.bitWidth());
                } else if (m instanceof PiTernaryFieldMatch) {
                    PiTernaryFieldMatch t = (PiTernaryFieldMatch) m;
                    assertFitsWidth(m.fieldId().toString(), t.value(), field.bitWidth());
                    assertFitsWidth(m.fieldId() + " mask", t.mask(), field.bitWidth());
                    assertEquals(m.fieldId() + ": value bits outside the mask", 0, new BigInteger(1, t.value().asArray())
                            .andNot(new BigInteger(1, t.mask().asArray())).signum());
                    assertTrue(table.id() + ": a ternary entry needs a priority above 0", rule.priority() > 0);
                } else {
                    fail("unexpected match kind " + m);
                }
            }
        }
        assertEquals(1, rule.treatment().allInstructions().size());
        Instruction i = rule.treatment().allInstructions().get(0);
        PiAction action = (PiAction) ((PiInstruction) i).action();
        PiActionModel am = table.action(action.id())
                .orElseThrow(() -> new AssertionError(action.id() + " is no action of " + table.id()));
        assertEquals(action.id() + " parameters", am.params().size(), action.parameters().size());
        for (PiActionParam p : action.parameters()) {
            PiActionParamModel pm = am.param(p.id())
                    .orElseThrow(() -> new AssertionError(p.id() + " is no parameter of " + action.id()));
            assertFitsWidth(action.id() + "." + p.id(), p.value(), pm.bitWidth());
        }
        return action;
    }

    private static void assertFitsWidth(String what, ImmutableByteSequence value, int bits) {
        try {
            value.fit(bits);
        } catch (ImmutableByteSequence.ByteSequenceTrimException e) {
            fail(what + " does not fit " + bits + " bits: " + value);
        }
    }

    /** An action parameter as an unsigned number. */
    public static long param(PiAction action, org.onosproject.net.pi.model.PiActionParamId id) {
        byte[] b = action.parameters().stream().filter(p -> p.id().equals(id)).findFirst()
                .orElseThrow(() -> new AssertionError("no " + id)).value().asArray();
        long v = 0;
        for (byte x : b) {
            v = (v << 8) | (x & 0xFF);
        }
        return v;
    }
}
