package rmqharness;

import java.util.ArrayList;
import java.util.List;

/**
 * The scripted transactional workload: what each transaction does, decided by its index so that
 * two runs with the same arguments send the same mix.
 *
 * <p>A script is C (commit at once), R (roll back at once), U<k><C|R> (UNKNOW, then commit or roll
 * back on the k-th check), N (UNKNOW on every check, so the broker discards it after
 * transactionCheckMax checks) or LATE (UNKNOW on every check; the producer ends it with a commit
 * that is not a check answer three rounds after it was sent, when its immunity has expired),
 * EARLY (immunity 16 s; the producer commits, not as a check answer, one round after sending:
 * inside its immunity, after that round put back its immunity copy, so the next round meets a copy
 * whose TRAN_PREPARED_QUEUE_OFFSET is named: spec rule 2) or AFTERCHK (no immunity, UNKNOW on
 * checks; the producer commits naming the original two rounds after sending, after the round that
 * checked it put back a check copy past the committed offset: the next round meets a copy whose
 * uniq key belongs to a resolved original: spec rule 3).
 */
final class Workload {
  private Workload() {}

  /** One transaction to send: its script and the raw CHECK_IMMUNITY_TIME_IN_SECONDS value. */
  record Tx(String script, String immunity, boolean old) {}

  // Immunity values: a normal one (16 s, two round periods), 0, -1 (= transactionTimeOut) and an
  // unparsable one (the broker reads it as -1). 16 and the 8 s round period keep every age at a
  // round about 4 s away from 0, 8, 16 and 24 s.
  private static final Tx[] WITH_IMMUNITY = {
    new Tx("C", "16", false),
    new Tx("U1C", "16", false),
    new Tx("N", "0", false),
    new Tx("U2C", "-1", false),
    // At index 4 so that the fixture's short run (make-fixture.sh) sends one in round 2 and its
    // kept round 3 meets the rule-2 copy.
    new Tx("EARLY", "16", false),
    new Tx("U1R", "abc", false),
    new Tx("N", "16", false),
    new Tx("LATE", "16", false),
    new Tx("U1R", "0", false),
    new Tx("R", "-1", false),
    new Tx("U3C", "16", false),
  };

  private static final Tx[] PLAIN = {
    new Tx("C", null, false),
    new Tx("R", null, false),
    new Tx("U1C", null, false),
    new Tx("U2R", null, false),
    new Tx("U3C", null, false),
    new Tx("N", null, false),
    new Tx("C", null, false),
    new Tx("U1R", null, false),
    new Tx("R", null, false),
    new Tx("U2C", null, false),
    new Tx("AFTERCHK", null, false),
  };

  /**
   * The batch of one send round: old half messages first (discarded as expired in the same round),
   * then the messages with an immunity property (so the broker reaches them while they are young,
   * before the first young message without one stops its scan), then the rest.
   */
  static List<Tx> batch(int size, int oldCount, int seed) {
    List<Tx> txs = new ArrayList<>();
    for (int i = 0; i < oldCount && txs.size() < size; i++) {
      txs.add(new Tx("N", null, true));
    }
    int rest = size - txs.size();
    int withImmunity = rest * 2 / 5;
    for (int i = 0; i < withImmunity; i++) {
      txs.add(WITH_IMMUNITY[Math.floorMod(seed + i, WITH_IMMUNITY.length)]);
    }
    for (int i = 0; i < rest - withImmunity; i++) {
      txs.add(PLAIN[Math.floorMod(seed + i, PLAIN.length)]);
    }
    return txs;
  }

  /**
   * Rounds after its send round before whose check the producer commits the transaction itself (a
   * non-check end naming the original half); 0 = never.
   */
  static int producerEndRounds(String script) {
    switch (script) {
      case "LATE":
        return 3;
      case "EARLY":
        return 1;
      case "AFTERCHK":
        return 2;
      default:
        return 0;
    }
  }

  /** The answer to the check whose copy carries {@code checkTimes}; null answers UNKNOW. */
  static String answer(String script, int checkTimes) {
    if (script.length() == 3 && script.charAt(0) == 'U') {
      int k = script.charAt(1) - '0';
      return checkTimes >= k ? script.substring(2) : null;
    }
    return null;
  }
}
