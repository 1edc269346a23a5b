package rmqharness;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;
import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.broker.transaction.TransactionalMessageCheckService;
import org.apache.rocketmq.broker.transaction.queue.DefaultTransactionalMessageCheckListener;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.constant.PermName;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.namesrv.NamesrvConfig;
import org.apache.rocketmq.common.sysflag.MessageSysFlag;
import org.apache.rocketmq.common.topic.TopicValidator;
import org.apache.rocketmq.namesrv.NamesrvController;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.netty.NettyClientConfig;
import org.apache.rocketmq.remoting.netty.NettyServerConfig;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.MessageStore;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.PutMessageStatus;
import org.apache.rocketmq.store.config.MessageStoreConfig;

/**
 * Real-broker harness, both version lines: an in-process NameServer and master broker, a scripted
 * transactional workload, and check rounds run only when the harness calls the broker's own
 * {@code TransactionalMessageService.check}. Compiled once per line with that line's {@link Line}
 * (what differs between 4.9 and 5.x). See harness/rocketmq/README.md for the output format.
 */
public final class Harness {
  static final BrokerLine LINE = new Line();
  // The version of the RocketMQ jars the harness runs on (V5_3_3 -> 5.3.3), not a second copy of
  // the one the line's pom pins.
  static final String VERSION = MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION).substring(1).replace('_', '.');
  static final String BROKER_NAME = "broker-h";
  static final long TX_TIMEOUT_MS = 8_000;
  static final int CHECK_MAX = 3;
  static final long OP_BATCH_INTERVAL_MS = 100;
  static final int FILE_RESERVED_HOURS = 1;
  static final int COMMITLOG_FILE_SIZE = 64 * 1024;
  static final int CQ_FILE_SIZE = 20 * 64;
  // The broker's own check timer is replaced by a no-op; the interval is kept for the record.
  static final long CHECK_INTERVAL_MS = 24L * 3600 * 1000;
  // One round every ROUND_PERIOD_MS; the round's messages are sent SEND_LEAD_MS before its T, so
  // their ages at rounds are 4, 12, 20, ... s (minus the sending time): 4 s away from the
  // boundaries 0, 8 (transactionTimeOut), 16 (the normal immunity) and 24. A 5.3.3 round takes
  // about 1 s (its op-less sleep), so the margin (round duration + 1 s) holds with room for a
  // busy machine.
  static final long ROUND_PERIOD_MS = 8_000;
  static final long SEND_LEAD_MS = 4_000;
  static final long OLD_AGE_MS = 2L * 3600 * 1000;
  static final int OLD_PER_ROUND = 2;
  static final int PLAIN_PER_ROUND = 4;
  static final int TAIL_ROUNDS = 5;
  static final String HALF_TOPIC = TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC;
  static final String OP_TOPIC = TopicValidator.RMQ_SYS_TRANS_OP_HALF_TOPIC;
  static final String DISCARD_TOPIC = TopicValidator.RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC;
  static final String SYS_GROUP = "CID_RMQ_SYS_TRANS";
  static final String READER_GROUP = "HARNESS_READER";
  static final String SCRIPT_KEY = "hscript";
  static final String[] GROUPS = {"PG_ORDERS", "PG_PAYMENTS", "PG_STOCK"};
  static final String[][] GROUP_TOPICS = {{"TxOrders"}, {"TxPayments"}, {"TxOrders", "TxStock"}};
  static final String PLAIN_TOPIC = "PlainEvents";

  /** A failure with one line for the user; exit code 2 (cannot start) or 3 (a round failed). */
  static final class Failure extends RuntimeException {
    final int code;

    Failure(int code, String message) {
      super(message);
      this.code = code;
    }
  }

  private final int rounds;
  private final int transactions;
  private final Path out;
  private final Path work;
  private NamesrvController namesrv;
  private BrokerController broker;
  private final List<TransactionMQProducer> producers = new ArrayList<>();
  private Json.Lines workloadLog;
  private Json.Lines callbackLog;
  private Json.Lines endTxLog;
  private Json.Lines roundLog;
  private final RecordingListener listener = new RecordingListener();
  private volatile CountDownLatch answerGate = new CountDownLatch(0);
  private final AtomicInteger endRequestsSent = new AtomicInteger();
  private final AtomicInteger endRequestsSeen = new AtomicInteger();
  private final AtomicInteger callbacksSeen = new AtomicInteger();
  // queue offsets of half entries named by an END_TRANSACTION the broker accepted (code 0)
  private final Set<Long> endedOffsets = ConcurrentHashMap.newKeySet();
  private final Map<String, String> scriptByKey = new ConcurrentHashMap<>();
  private final List<Late> lateEnds = new ArrayList<>();
  private int sent;

  record Late(int round, TransactionMQProducer producer, Message msg, SendResult result) {}

  Harness(int rounds, int transactions, Path out, Path work) {
    this.rounds = rounds;
    this.transactions = transactions;
    this.out = out;
    this.work = work;
  }

  public static void main(String[] args) {
    Harness h;
    try {
      h = fromArgs(args);
    } catch (Failure f) {
      System.err.println("error: " + f.getMessage());
      System.exit(f.code);
      return;
    }
    Path out = h.out;
    int code = 0;
    try {
      h.run();
    } catch (Failure f) {
      System.err.println("error: " + f.getMessage());
      code = f.code;
    } catch (Throwable t) {
      // One line for the user; the stack trace goes to the run directory.
      System.err.println("error: harness failed: " + t + " (stack trace in " + out.resolve("harness-error.txt") + ")");
      try {
        Files.createDirectories(out);
        java.io.StringWriter trace = new java.io.StringWriter();
        t.printStackTrace(new java.io.PrintWriter(trace));
        Files.writeString(out.resolve("harness-error.txt"), trace.toString());
      } catch (IOException ignored) {
        // the error line above is what matters
      }
      code = 3;
    } finally {
      h.stopAll();
    }
    if (code == 0) System.out.println("run=" + out);
    // Broker threads (netty, schedulers) are not all daemons: end the JVM explicitly.
    System.exit(code);
  }

  private static Harness fromArgs(String[] args) {
    Map<String, String> opts = parseArgs(args);
    int rounds = intArg(opts, "rounds", 12);
    int transactions = intArg(opts, "transactions", 500);
    if (!opts.containsKey("out")) fail(2, "--out DIR is required");
    if (rounds < TAIL_ROUNDS + 1) fail(2, "--rounds must be at least " + (TAIL_ROUNDS + 1));
    if (transactions < 1) fail(2, "--transactions must be at least 1");
    Path out = Path.of(opts.get("out")).toAbsolutePath();
    Path work = Path.of(System.getProperty("java.io.tmpdir")).toAbsolutePath().resolve("broker");
    return new Harness(rounds, transactions, out, work);
  }

  private static int intArg(Map<String, String> opts, String name, int dflt) {
    try {
      return Integer.parseInt(opts.getOrDefault(name, String.valueOf(dflt)));
    } catch (NumberFormatException e) {
      fail(2, "--" + name + " must be an integer, not " + opts.get(name));
      return dflt;
    }
  }

  private static Map<String, String> parseArgs(String[] args) {
    Map<String, String> opts = new HashMap<>();
    for (int i = 0; i < args.length; i++) {
      if (!args[i].startsWith("--") || i + 1 >= args.length) fail(2, "bad argument: " + args[i]);
      opts.put(args[i].substring(2), args[++i]);
    }
    return opts;
  }

  static void fail(int code, String message) {
    throw new Failure(code, message);
  }

  void run() throws Exception {
    Files.createDirectories(out.resolve("snapshots"));
    Files.createDirectories(work);
    long startedMs = System.currentTimeMillis();
    workloadLog = new Json.Lines(out.resolve("workload.jsonl"));
    callbackLog = new Json.Lines(out.resolve("callbacks.jsonl"));
    endTxLog = new Json.Lines(out.resolve("endtx.jsonl"));
    roundLog = new Json.Lines(out.resolve("rounds.jsonl"));
    String nsAddr = startNamesrv();
    startBroker(nsAddr);
    System.err.println("harness: broker started after " + (System.currentTimeMillis() - startedMs) + " ms");
    startProducers(nsAddr);
    System.err.println("harness: broker " + VERSION + " and producers up in " + (System.currentTimeMillis() - startedMs) + " ms");
    int sendRounds = rounds - TAIL_ROUNDS;
    int perRound = (transactions + sendRounds - 1) / sendRounds;
    long t1 = System.currentTimeMillis() + SEND_LEAD_MS + 500;
    int liveRound = Math.max(1, sendRounds / 2);
    for (int r = 1; r <= rounds; r++) {
      long asOfTarget = t1 + (r - 1) * ROUND_PERIOD_MS;
      sleepUntil(asOfTarget - SEND_LEAD_MS);
      Thread live = r == liveRound ? liveSnapshot() : null;
      // Old half messages go in every round, so expired discards meet the tail's max discards.
      sendRound(r, r <= sendRounds ? Math.min(perRound, transactions - sent) : OLD_PER_ROUND);
      resolvePending();
      sendLateEnds(r);
      if (live != null) live.join();
      quiesce(r);
      Path snap = out.resolve(String.format("snapshots/round-%03d", r));
      snapshot(snap);
      if (System.currentTimeMillis() > asOfTarget) {
        fail(3, "round " + r + ": sending and quiescing overran the round's T by "
            + (System.currentTimeMillis() - asOfTarget) + " ms (machine too busy)");
      }
      sleepUntil(asOfTarget);
      runRound(r);
      awaitAnswers(r);
    }
    writeManifest(startedMs);
  }

  // ---------------------------------------------------------------- start and stop

  private String startNamesrv() throws Exception {
    NamesrvConfig nc = new NamesrvConfig();
    nc.setKvConfigPath(work.resolve("namesrv/kvConfig.json").toString());
    nc.setConfigStorePath(work.resolve("namesrv/namesrv.properties").toString());
    nc.setRocketmqHome(work.toString());
    NettyServerConfig nsc = new NettyServerConfig();
    nsc.setListenPort(freePort(false));
    LINE.configureNameServer(nsc);
    namesrv = new NamesrvController(nc, nsc);
    if (!namesrv.initialize()) fail(2, "name server failed to initialize");
    try {
      namesrv.start();
    } catch (Exception e) {
      fail(2, "name server failed to start on port " + nsc.getListenPort() + ": " + e);
    }
    return "127.0.0.1:" + nsc.getListenPort();
  }

  private void startBroker(String nsAddr) throws Exception {
    BrokerConfig bc = new BrokerConfig();
    bc.setBrokerName(BROKER_NAME);
    bc.setBrokerClusterName("harness");
    bc.setBrokerIP1("127.0.0.1");
    bc.setNamesrvAddr(nsAddr);
    bc.setRocketmqHome(work.toString());
    // Off: a client that asks before the route is registered would otherwise fall back to the
    // default topic's 4 queues and send to queues our topics do not have.
    bc.setAutoCreateTopicEnable(false);
    bc.setTransactionTimeOut(TX_TIMEOUT_MS);
    bc.setTransactionCheckMax(CHECK_MAX);
    bc.setTransactionCheckInterval(CHECK_INTERVAL_MS);
    bc.setEnablePropertyFilter(false);
    MessageStoreConfig sc = new MessageStoreConfig();
    Path store = work.resolve("store");
    sc.setStorePathRootDir(store.toString());
    sc.setStorePathCommitLog(store.resolve("commitlog").toString());
    sc.setMappedFileSizeCommitLog(COMMITLOG_FILE_SIZE);
    sc.setMappedFileSizeConsumeQueue(CQ_FILE_SIZE);
    sc.setMaxMessageSize(16 * 1024);
    sc.setFileReservedTime(FILE_RESERVED_HOURS);
    sc.setMaxIndexNum(1000);
    sc.setMaxHashSlotNum(4000);
    sc.setHaListenPort(0);
    NettyServerConfig bsc = new NettyServerConfig();
    // Fixed before initialize(): the transaction bridge captures the store host (and so the port
    // op messages carry) during initialize().
    bsc.setListenPort(freePort(true));
    LINE.configureBroker(bc, sc, bsc, OP_BATCH_INTERVAL_MS);
    broker = new BrokerController(bc, bsc, new NettyClientConfig(), sc);
    boolean ok;
    try {
      ok = broker.initialize();
    } catch (Exception e) {
      ok = false;
    }
    if (!ok) fail(2, "broker failed to initialize (store " + store + ", port " + bsc.getListenPort() + ")");
    // Rounds run only when the harness calls check(): the timer's onWaitEnd does nothing, which
    // also removes the extra round a stopping check service would run.
    broker.setTransactionalMessageCheckService(new TransactionalMessageCheckService(broker) {
      @Override
      protected void onWaitEnd() {}
    });
    listener.setBrokerController(broker);
    LINE.initCheckListener(listener);
    broker.registerServerRPCHook(new EndTxHook());
    try {
      broker.start();
    } catch (Exception e) {
      fail(2, "broker failed to start on port " + bsc.getListenPort() + ": " + e);
    }
    for (String[] topics : GROUP_TOPICS) {
      for (String t : topics) createTopic(t, 4);
    }
    createTopic(PLAIN_TOPIC, 2);
    broker.registerBrokerAll(true, false, true);
  }

  private void createTopic(String topic, int queues) {
    broker.getTopicConfigManager().updateTopicConfig(
        new TopicConfig(topic, queues, queues, PermName.PERM_READ | PermName.PERM_WRITE));
  }

  private void startProducers(String nsAddr) throws Exception {
    for (String group : GROUPS) {
      TransactionMQProducer p = new TransactionMQProducer(group);
      p.setNamesrvAddr(nsAddr);
      p.setInstanceName("harness-" + group);
      p.setHeartbeatBrokerInterval(1000);
      p.setPollNameServerInterval(1000);
      p.setSendMsgTimeout(10_000);
      // Check answers wait on the round's gate: more threads than a round has checks in flight.
      p.setExecutorService(Executors.newFixedThreadPool(16));
      p.setTransactionListener(new ScriptedListener());
      p.start();
      producers.add(p);
      // A producer heartbeats only to brokers it knows from a topic route: one ordinary message
      // teaches it the broker, so checks can reach it from round 1 on.
      warmUp(p, group);
    }
    long deadline = System.currentTimeMillis() + 30_000;
    for (String group : GROUPS) {
      while (broker.getProducerManager().getAvailableChannel(group) == null) {
        if (System.currentTimeMillis() > deadline) fail(2, "producer " + group + " never registered with the broker");
        Thread.sleep(100);
      }
    }
  }

  /** Sends one ordinary message, retrying while the name server does not know the route yet. */
  private static void warmUp(TransactionMQProducer p, String group) throws InterruptedException {
    long deadline = System.currentTimeMillis() + 30_000;
    Message warm = new Message(PLAIN_TOPIC, "warmup", group.getBytes(StandardCharsets.UTF_8));
    while (true) {
      try {
        if (p.send(warm).getSendStatus() == SendStatus.SEND_OK) return;
      } catch (Exception e) {
        if (System.currentTimeMillis() > deadline) fail(2, "producer " + group + " cannot reach the broker: " + e);
      }
      Thread.sleep(200);
    }
  }

  /** Stops producers, broker and name server, in that order; each step on its own. */
  void stopAll() {
    long t0 = System.currentTimeMillis();
    for (TransactionMQProducer p : producers) {
      try {
        p.shutdown();
      } catch (Throwable ignored) {
        // keep stopping the rest
      }
    }
    answerGate.countDown();
    if (broker != null) {
      try {
        broker.shutdown();
      } catch (Throwable ignored) {
        // keep stopping the rest
      }
    }
    if (namesrv != null) {
      try {
        namesrv.shutdown();
      } catch (Throwable ignored) {
        // nothing left to stop
      }
    }
    System.err.println("harness: stopped in " + (System.currentTimeMillis() - t0) + " ms");
    for (Json.Lines l : new Json.Lines[] {workloadLog, callbackLog, endTxLog, roundLog}) {
      try {
        if (l != null) l.close();
      } catch (IOException ignored) {
        // best effort
      }
    }
  }

  /** A free loopback port; for the broker also one whose port - 2 is free (its "fast" server). */
  private static int freePort(boolean alsoMinusTwo) throws IOException {
    for (int attempt = 0; attempt < 50; attempt++) {
      int port;
      try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
        port = s.getLocalPort();
      }
      if (!alsoMinusTwo) return port;
      if (port - 2 < 1024) continue;
      try (ServerSocket s = new ServerSocket(port - 2, 1, java.net.InetAddress.getLoopbackAddress())) {
        return port;
      } catch (IOException taken) {
        // try another
      }
    }
    fail(2, "no free loopback port pair (P, P-2) found");
    return -1;
  }

  // ---------------------------------------------------------------- workload

  private void sendRound(int round, int count) throws Exception {
    if (count <= 0) return;
    List<Workload.Tx> batch = Workload.batch(count, OLD_PER_ROUND, round * 7);
    int i = 0;
    for (Workload.Tx tx : batch) {
      int g = Math.floorMod(round + i, GROUPS.length);
      String[] topics = GROUP_TOPICS[g];
      String topic = topics[Math.floorMod(i, topics.length)];
      if (tx.old()) sendOld(GROUPS[g], topic, tx);
      else sendTx(producers.get(g), GROUPS[g], topic, tx, round);
      i++;
    }
    for (int k = 0; k < PLAIN_PER_ROUND; k++) {
      Message m = new Message(PLAIN_TOPIC, "plain", ("plain " + round + "-" + k).getBytes(StandardCharsets.UTF_8));
      SendResult r = producers.get(0).send(m);
      if (r.getSendStatus() != SendStatus.SEND_OK) fail(3, "ordinary send failed: " + r);
    }
  }

  private void sendTx(TransactionMQProducer p, String group, String topic, Workload.Tx tx, int round)
      throws Exception {
    Message m = new Message(topic, "tx", ("tx " + sent).getBytes(StandardCharsets.UTF_8));
    m.putUserProperty(SCRIPT_KEY, tx.script());
    if (tx.immunity() != null) m.putUserProperty(MessageConst.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, tx.immunity());
    long sendMs = System.currentTimeMillis();
    TransactionSendResult r = p.sendMessageInTransaction(m, null);
    if (r.getSendStatus() != SendStatus.SEND_OK) fail(3, "transactional send failed: " + r);
    String uniq = m.getProperty(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX);
    scriptByKey.put(uniq, tx.script());
    // The half's commit-log offset is not in a transactional send result (its offsetMsgId is
    // null): it is read back from the half queue once dispatch caught up (resolvePending).
    pending.add(workloadRow(uniq, group, topic, r.getMessageQueue().getQueueId(), tx, r.getQueueOffset(), -1, sendMs));
    int endAfter = Workload.producerEndRounds(tx.script());
    if (endAfter > 0) lateEnds.add(new Late(round + endAfter, p, m, r));
  }

  /** An old half message, born OLD_AGE_MS ago, written through the broker's half-message path. */
  private void sendOld(String group, String topic, Workload.Tx tx) {
    Line.BrokerMessage m = new Line.BrokerMessage();
    m.setTopic(topic);
    m.setQueueId(0);
    m.setBody(("old " + sent).getBytes(StandardCharsets.UTF_8));
    m.setTags("tx");
    String uniq = MessageClientIDSetter.createUniqID();
    MessageAccessor.putProperty(m, MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq);
    MessageAccessor.putProperty(m, MessageConst.PROPERTY_TRANSACTION_PREPARED, "true");
    MessageAccessor.putProperty(m, MessageConst.PROPERTY_PRODUCER_GROUP, group);
    MessageAccessor.putProperty(m, SCRIPT_KEY, tx.script());
    m.setPropertiesString(MessageDecoder.messageProperties2String(m.getProperties()));
    m.setTagsCode(Line.BrokerMessage.tagsString2tagsCode("tx"));
    m.setSysFlag(MessageSysFlag.TRANSACTION_PREPARED_TYPE);
    long sendMs = System.currentTimeMillis();
    m.setBornTimestamp(sendMs - OLD_AGE_MS);
    m.setBornHost(new InetSocketAddress("127.0.0.1", 10000));
    m.setStoreHost(broker.getStoreHost());
    PutMessageResult r = broker.getTransactionalMessageService().prepareMessage(m);
    if (r == null || r.getPutMessageStatus() != PutMessageStatus.PUT_OK) fail(3, "old half message put failed: " + r);
    scriptByKey.put(uniq, tx.script());
    long qo = r.getAppendMessageResult().getLogicsOffset();
    long co = r.getAppendMessageResult().getWroteOffset();
    pending.add(workloadRow(uniq, group, topic, 0, tx, qo, co, sendMs));
  }

  private final List<Map<String, Object>> pending = new ArrayList<>();
  private final Map<String, Long> halfCommitlogOffset = new HashMap<>();

  /** Writes the round's workload lines, each half's commit-log offset read from the half queue. */
  private void resolvePending() throws InterruptedException {
    awaitDispatch();
    for (Map<String, Object> row : pending) {
      long qo = (Long) row.get("half_queue_offset");
      MessageExt m = read(HALF_TOPIC, qo, qo + 1).get(0);
      String uniq = m.getProperty(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX);
      if (!row.get("uniq_key").equals(uniq)) {
        fail(3, "half queue offset " + qo + " holds " + uniq + ", not " + row.get("uniq_key"));
      }
      row.put("half_commitlog_offset", m.getCommitLogOffset());
      halfCommitlogOffset.put(uniq, m.getCommitLogOffset());
      workloadLog.write(row);
      sent++;
    }
    pending.clear();
  }

  private Map<String, Object> workloadRow(String uniq, String group, String topic, int queueId, Workload.Tx tx, long halfQo,
      long halfCo, long sendMs) {
    Map<String, Object> row = new LinkedHashMap<>();
    row.put("uniq_key", uniq);
    row.put("producer_group", group);
    row.put("topic", topic);
    row.put("queue_id", queueId);
    row.put("script", tx.script());
    row.put("immunity", tx.immunity());
    row.put("half_queue_offset", halfQo);
    row.put("half_commitlog_offset", halfCo);
    row.put("send_ms", sendMs);
    row.put("old", tx.old());
    return row;
  }

  /** Producer-side (non-check) commits of LATE, EARLY and AFTERCHK transactions (Workload). */
  private void sendLateEnds(int round) throws Exception {
    for (Late late : lateEnds) {
      if (late.round() != round) continue;
      // The client derives the half's commit-log offset from offsetMsgId, which a transactional
      // send result leaves null (it would decode the uniq key instead): set it from the store.
      String uniq = late.msg().getProperty(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX);
      late.result().setOffsetMsgId(MessageDecoder.createMessageId(broker.getStoreHost(), halfCommitlogOffset.get(uniq)));
      endRequestsSent.incrementAndGet();
      late.producer().getDefaultMQProducerImpl()
          .endTransaction(late.msg(), late.result(), LocalTransactionState.COMMIT_MESSAGE, null);
    }
  }

  /** The producers' transaction listener: answers by script and the copy's check counter. */
  final class ScriptedListener implements TransactionListener {
    @Override
    public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
      endRequestsSent.incrementAndGet();
      String script = msg.getUserProperty(SCRIPT_KEY);
      return switch (script) {
        case "C" -> LocalTransactionState.COMMIT_MESSAGE;
        case "R" -> LocalTransactionState.ROLLBACK_MESSAGE;
        default -> LocalTransactionState.UNKNOW;
      };
    }

    @Override
    public LocalTransactionState checkLocalTransaction(MessageExt msg) {
      long wall = System.currentTimeMillis();
      // Answers are held until the round's check() has returned, so they land between rounds.
      try {
        answerGate.await(60, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      String timesStr = msg.getProperty(MessageConst.PROPERTY_TRANSACTION_CHECK_TIMES);
      int times = parseIntOr(timesStr, -1);
      String answer = Workload.answer(msg.getUserProperty(SCRIPT_KEY), times);
      Map<String, Object> row = new LinkedHashMap<>();
      row.put("wall_ms", wall);
      row.put("uniq_key", msg.getProperty(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX));
      row.put("check_times", times < 0 ? null : times);
      row.put("queue_offset", msg.getQueueOffset());
      row.put("commitlog_offset", msg.getCommitLogOffset());
      row.put("answer", answer == null ? "UNKNOW" : answer.equals("C") ? "COMMIT" : "ROLLBACK");
      callbackLog.write(row);
      endRequestsSent.incrementAndGet();
      callbacksSeen.incrementAndGet();
      if (answer == null) return LocalTransactionState.UNKNOW;
      return answer.equals("C") ? LocalTransactionState.COMMIT_MESSAGE : LocalTransactionState.ROLLBACK_MESSAGE;
    }
  }

  /** Server RPC hook: every END_TRANSACTION request the broker answered. */
  final class EndTxHook implements RPCHook {
    @Override
    public void doBeforeRequest(String remoteAddr, RemotingCommand request) {}

    @Override
    public void doAfterResponse(String remoteAddr, RemotingCommand request, RemotingCommand response) {
      if (request.getCode() != Line.RequestCodes.END_TRANSACTION) return;
      Map<String, Object> row = new LinkedHashMap<>();
      row.put("wall_ms", System.currentTimeMillis());
      row.put("ext_fields", request.getExtFields() == null ? null : new java.util.TreeMap<>(request.getExtFields()));
      row.put("response_code", response == null ? null : response.getCode());
      row.put("remark", response == null ? null : response.getRemark());
      endTxLog.write(row);
      if (response != null && response.getCode() == 0 && request.getExtFields() != null) {
        String qo = request.getExtFields().get("tranStateTableOffset");
        if (qo != null) endedOffsets.add(Long.parseLong(qo));
      }
      endRequestsSeen.incrementAndGet();
    }
  }

  // ---------------------------------------------------------------- rounds

  /** The broker's own default listener, recording what the check algorithm hands it. */
  static final class RecordingListener extends DefaultTransactionalMessageCheckListener {
    final Set<Long> checkedCopies = ConcurrentHashMap.newKeySet();
    final List<Map<String, Object>> discards = new ArrayList<>();
    volatile int checks;

    @Override
    public void resolveHalfMsg(MessageExt msgExt) {
      // check() has put the copy back already: msgExt's offsets are the new copy's.
      checkedCopies.add(msgExt.getCommitLogOffset());
      checks++;
      super.resolveHalfMsg(msgExt);
    }

    @Override
    public void resolveDiscardMsg(MessageExt msgExt) {
      Map<String, Object> d = new LinkedHashMap<>();
      d.put("uniq_key", msgExt.getProperty(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX));
      d.put("check_times", msgExt.getProperty(MessageConst.PROPERTY_TRANSACTION_CHECK_TIMES));
      d.put("half_queue_offset", msgExt.getQueueOffset());
      d.put("half_commitlog_offset", msgExt.getCommitLogOffset());
      discards.add(d);
      super.resolveDiscardMsg(msgExt);
    }
  }

  private void runRound(int r) throws Exception {
    MessageStore store = broker.getMessageStore();
    Map<String, Object> row = new LinkedHashMap<>();
    row.put("round", r);
    row.put("snapshot", String.format("snapshots/round-%03d", r));
    long halfMax0 = maxOffset(HALF_TOPIC);
    long opMax0 = maxOffset(OP_TOPIC);
    long discardMax0 = maxOffset(DISCARD_TOPIC);
    long halfCommitted0 = committed(HALF_TOPIC);
    long opCommitted0 = committed(OP_TOPIC);
    listener.checkedCopies.clear();
    listener.discards.clear();
    listener.checks = 0;
    answerGate = new CountDownLatch(1);
    long asOf = System.currentTimeMillis();
    broker.getTransactionalMessageService().check(TX_TIMEOUT_MS, CHECK_MAX, listener);
    long ended = System.currentTimeMillis();
    // The "after" values are read while the round's answers are still held, so no end the
    // answers cause (and no op it writes) can be counted as part of the round.
    awaitDispatch();
    long halfMax1 = maxOffset(HALF_TOPIC);
    long discardMax1 = maxOffset(DISCARD_TOPIC);
    long opMax1 = maxOffset(OP_TOPIC);
    long halfCommitted1 = committed(HALF_TOPIC);
    long opCommitted1 = committed(OP_TOPIC);
    answerGate.countDown();
    // A missing committed offset (-1) means the queue's minimum, as the broker reads it.
    long scanFrom = halfCommitted0 < 0 ? broker.getMessageStore().getMinOffsetInQueue(HALF_TOPIC, 0) : halfCommitted0;
    long[] margin = minMargin(scanFrom, halfMax0, asOf);
    long needed = (ended - asOf) + 1000;
    row.put("as_of_ms", asOf);
    row.put("check_started_ms", asOf);
    row.put("check_ended_ms", ended);
    row.put("half_max_before", halfMax0);
    row.put("half_max_after", halfMax1);
    row.put("op_max_before", opMax0);
    row.put("op_max_after", opMax1);
    row.put("half_committed_before", halfCommitted0);
    row.put("half_committed_after", halfCommitted1);
    row.put("op_committed_before", opCommitted0);
    row.put("op_committed_after", opCommitted1);
    row.put("discard_max_before", discardMax0);
    row.put("discard_max_after", discardMax1);
    row.put("appended", appended(halfMax0, halfMax1));
    row.put("discards", discarded(discardMax0, discardMax1));
    // No undecided entry at all: nothing can fall on a boundary (min_margin_ms null).
    boolean none = margin[0] == Long.MAX_VALUE;
    row.put("margin_ok", margin[0] >= needed);
    row.put("min_margin_ms", none ? null : margin[0]);
    row.put("min_margin_queue_offset", none ? null : margin[1]);
    row.put("checks_sent", listener.checks);
    roundLog.write(row);
    if (margin[0] < needed) {
      fail(3, "round " + r + " broke the age margin: a message's age was " + margin[0]
          + " ms from a timeout/immunity boundary, the round needed " + needed + " ms (half queue offset "
          + margin[1] + ")");
    }
  }

  private List<Map<String, Object>> appended(long from, long to) {
    List<Map<String, Object>> rows = new ArrayList<>();
    for (MessageExt m : read(HALF_TOPIC, from, to)) {
      Map<String, Object> e = new LinkedHashMap<>();
      e.put("queue_offset", m.getQueueOffset());
      e.put("commitlog_offset", m.getCommitLogOffset());
      e.put("uniq_key", m.getProperty(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX));
      e.put("check_times", intOrNull(m.getProperty(MessageConst.PROPERTY_TRANSACTION_CHECK_TIMES)));
      e.put("prepared_queue_offset", longOrNull(m.getProperty(MessageConst.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)));
      e.put("store_timestamp_ms", m.getStoreTimestamp());
      e.put("born_timestamp_ms", m.getBornTimestamp());
      e.put("kind", listener.checkedCopies.contains(m.getCommitLogOffset()) ? "check" : "immunity");
      rows.add(e);
    }
    return rows;
  }

  private List<Map<String, Object>> discarded(long from, long to) {
    List<Map<String, Object>> seen = new ArrayList<>(listener.discards);
    List<Map<String, Object>> rows = new ArrayList<>();
    long qo = from;
    for (MessageExt m : read(DISCARD_TOPIC, from, to)) {
      String uniq = m.getProperty(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX);
      String times = m.getProperty(MessageConst.PROPERTY_TRANSACTION_CHECK_TIMES);
      Map<String, Object> match = null;
      for (Map<String, Object> d : seen) {
        if (uniq != null && uniq.equals(d.get("uniq_key")) && java.util.Objects.equals(times, d.get("check_times"))) {
          match = d;
          break;
        }
      }
      if (match != null) seen.remove(match);
      Map<String, Object> e = new LinkedHashMap<>();
      e.put("discard_queue_offset", qo++);
      e.put("commitlog_offset", m.getCommitLogOffset());
      e.put("uniq_key", uniq);
      e.put("check_times", intOrNull(times));
      e.put("born_timestamp_ms", m.getBornTimestamp());
      e.put("store_timestamp_ms", m.getStoreTimestamp());
      e.put("listener_seen", match != null);
      e.put("half_queue_offset", match == null ? null : match.get("half_queue_offset"));
      e.put("half_commitlog_offset", match == null ? null : match.get("half_commitlog_offset"));
      rows.add(e);
    }
    if (!seen.isEmpty()) fail(3, "the listener saw " + seen.size() + " discards that are not in " + DISCARD_TOPIC);
    return rows;
  }

  /**
   * The smallest distance, at T, between the age of a half entry the round may decide on and any
   * boundary the broker compares it with (0, its check immunity, fileReservedTime). Entries named by
   * an accepted END_TRANSACTION are decided by their op, not their age, and are left out.
   */
  private long[] minMargin(long from, long to, long asOf) {
    long best = Long.MAX_VALUE;
    long where = -1;
    long reservedMs = FILE_RESERVED_HOURS * 3600L * 1000;
    for (MessageExt m : read(HALF_TOPIC, from, to)) {
      if (endedOffsets.contains(m.getQueueOffset())) continue;
      long age = asOf - m.getBornTimestamp();
      long boundary = immunityMs(m.getProperty(MessageConst.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS));
      long d = Math.min(Math.abs(age - boundary), Math.min(Math.abs(age), Math.abs(age - reservedMs)));
      if (d < best) {
        best = d;
        where = m.getQueueOffset();
      }
    }
    return new long[] {best, where};
  }

  /** The broker's reading of CHECK_IMMUNITY_TIME_IN_SECONDS: -1 or unparsable = transactionTimeOut. */
  static long immunityMs(String raw) {
    if (raw == null) return TX_TIMEOUT_MS;
    long v;
    try {
      v = Long.parseLong(raw);
    } catch (NumberFormatException e) {
      v = -1;
    }
    return v == -1 ? TX_TIMEOUT_MS : v * 1000;
  }

  /** Quiesce: earlier answers landed, op batches written, dispatch caught up, ops stable. */
  private void quiesce(int r) throws Exception {
    long deadline = System.currentTimeMillis() + 10_000;
    while (endRequestsSeen.get() < endRequestsSent.get()) {
      if (System.currentTimeMillis() > deadline) {
        fail(3, "round " + r + ": only " + endRequestsSeen.get() + " of " + endRequestsSent.get()
            + " END_TRANSACTION requests reached the broker");
      }
      Thread.sleep(20);
    }
    // 5.x buffers ends and writes them as op batches; 4.9 writes one op message per end at once.
    // Either way: wait until no end is buffered and the op queue stops growing.
    long opMax = -1;
    while (true) {
      boolean buffered = LINE.opsBuffered(broker);
      awaitDispatch();
      long now = maxOffset(OP_TOPIC);
      if (!buffered && now == opMax) break;
      opMax = now;
      if (System.currentTimeMillis() > deadline) fail(3, "round " + r + ": op records did not settle");
      Thread.sleep(2 * OP_BATCH_INTERVAL_MS + 50);
    }
  }

  private void awaitAnswers(int r) throws Exception {
    long deadline = System.currentTimeMillis() + 10_000;
    int expected = callbacksBefore + listener.checks;
    while (callbacksSeen.get() < expected && System.currentTimeMillis() < deadline) Thread.sleep(20);
    if (callbacksSeen.get() < expected) {
      System.err.println("warning: round " + r + ": " + (expected - callbacksSeen.get())
          + " check callbacks never reached a producer (oneway checks are lossy)");
    }
    callbacksBefore = callbacksSeen.get();
  }

  private int callbacksBefore;

  private void awaitDispatch() throws InterruptedException {
    long deadline = System.currentTimeMillis() + 10_000;
    while (broker.getMessageStore().dispatchBehindBytes() > 0) {
      if (System.currentTimeMillis() > deadline) fail(3, "the consume queues never caught up with the commit log");
      Thread.sleep(10);
    }
  }

  private long maxOffset(String topic) {
    try {
      return broker.getMessageStore().getMaxOffsetInQueue(topic, 0);
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }

  private long committed(String topic) {
    return broker.getConsumerOffsetManager().queryOffset(SYS_GROUP, topic, 0);
  }

  /** Decoded messages of queue 0 of a topic, queue offsets [from, to). */
  private List<MessageExt> read(String topic, long from, long to) {
    List<MessageExt> msgs = new ArrayList<>();
    long next = from;
    while (next < to) {
      GetMessageResult res = broker.getMessageStore().getMessage(READER_GROUP, topic, 0, next, 32, null);
      if (res == null || res.getMessageBufferList().isEmpty()) {
        throw new IllegalStateException("cannot read " + topic + " at queue offset " + next + ": "
            + (res == null ? "null" : res.getStatus()));
      }
      try {
        List<ByteBuffer> buffers = res.getMessageBufferList();
        for (int i = 0; i < buffers.size() && next < to; i++) {
          MessageExt m = MessageDecoder.decode(buffers.get(i), true, false);
          m.setQueueOffset(LINE.queueOffset(res, i, m));
          msgs.add(m);
          next = m.getQueueOffset() + 1;
        }
      } finally {
        res.release();
      }
    }
    return msgs;
  }

  // ---------------------------------------------------------------- snapshots

  private Thread liveSnapshot() {
    Thread t = new Thread(() -> {
      try {
        Thread.sleep(50);
        snapshot(out.resolve("snapshots/live"));
      } catch (Exception e) {
        throw new IllegalStateException("live snapshot failed: " + e, e);
      }
    }, "live-snapshot");
    t.start();
    return t;
  }

  /** commitlog/, consumequeue/ and config/consumerOffset.json (from the broker's memory). */
  private void snapshot(Path dest) throws IOException {
    Path store = work.resolve("store");
    copyTree(store.resolve("commitlog"), dest.resolve("commitlog"));
    copyTree(store.resolve("consumequeue"), dest.resolve("consumequeue"));
    Files.createDirectories(dest.resolve("config"));
    Files.writeString(dest.resolve("config/consumerOffset.json"), broker.getConsumerOffsetManager().encode(true));
  }

  private static void copyTree(Path src, Path dest) throws IOException {
    if (!Files.exists(src)) return;
    try (Stream<Path> paths = Files.walk(src)) {
      paths.forEach(p -> {
        Path d = dest.resolve(src.relativize(p).toString());
        try {
          if (Files.isDirectory(p)) Files.createDirectories(d);
          else Files.copy(p, d, StandardCopyOption.REPLACE_EXISTING);
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      });
    }
  }

  private void writeManifest(long startedMs) throws IOException {
    Map<String, Object> settings = new LinkedHashMap<>();
    settings.put("transaction_timeout_ms", TX_TIMEOUT_MS);
    settings.put("check_max", CHECK_MAX);
    settings.put("check_interval_ms", CHECK_INTERVAL_MS);
    settings.put("file_reserved_hours", FILE_RESERVED_HOURS);
    settings.put("op_batch_interval_ms", OP_BATCH_INTERVAL_MS);
    settings.put("mapped_file_size_commitlog", COMMITLOG_FILE_SIZE);
    settings.put("mapped_file_size_consume_queue", CQ_FILE_SIZE);
    settings.put("round_period_ms", ROUND_PERIOD_MS);
    Map<String, Object> m = new LinkedHashMap<>();
    m.put("rocketmq_version", VERSION);
    m.put("broker_name", BROKER_NAME);
    m.put("settings", settings);
    m.put("rounds", rounds);
    m.put("transactions", sent);
    m.put("started_ms", startedMs);
    m.put("ended_ms", System.currentTimeMillis());
    Files.writeString(out.resolve("manifest.json"), Json.write(m) + "\n");
  }

  // ---------------------------------------------------------------- small helpers

  private static void sleepUntil(long wallMs) throws InterruptedException {
    long d = wallMs - System.currentTimeMillis();
    if (d > 0) Thread.sleep(d);
  }

  static int parseIntOr(String s, int dflt) {
    try {
      return s == null ? dflt : Integer.parseInt(s);
    } catch (NumberFormatException e) {
      return dflt;
    }
  }

  static Integer intOrNull(String s) {
    try {
      return s == null ? null : Integer.valueOf(s);
    } catch (NumberFormatException e) {
      return null;
    }
  }

  static Long longOrNull(String s) {
    try {
      return s == null ? null : Long.valueOf(s);
    } catch (NumberFormatException e) {
      return null;
    }
  }
}
