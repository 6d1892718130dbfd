package org.innetagg.onos.owner;

import java.util.Optional;

/**
 * Which optimizer writes to this ONOS: one claim, held by one optimizer database (its
 * replicas share it) and renewed before it expires. A second optimizer with another database
 * finds the claim taken and does not write, even while the first holds no intent
 * (docs/service.md, "Invariants").
 */
public interface OwnerService {

    /** A claim in force: who, since when renewed, and for how much longer. */
    final class Claim {
        public final String owner;
        public final String holder;
        public final long expiresInMs;

        public Claim(String owner, String holder, long expiresInMs) {
            this.owner = owner;
            this.holder = holder;
            this.expiresInMs = expiresInMs;
        }
    }

    /** Thrown when another owner's claim is in force. */
    final class Taken extends Exception {
        private static final long serialVersionUID = 1L;
        public final transient Claim claim;

        public Taken(Claim claim) {
            super("owner: ONOS is written by optimizer store '" + claim.owner + "' (instance '" + claim.holder
                    + "') for " + (claim.expiresInMs + 999) / 1000 + " s more unless it renews its claim");
            this.claim = claim;
        }
    }

    /** Takes or renews the claim for {@code owner} for {@code ttlMs}; Taken if another holds it. */
    Claim claim(String owner, String holder, long ttlMs) throws Taken;

    Optional<Claim> current();

    /** Lets go of the claim if {@code owner} holds it; false otherwise. */
    boolean release(String owner);
}
