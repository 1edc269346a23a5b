package rmqharness;

import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.broker.transaction.queue.DefaultTransactionalMessageCheckListener;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.netty.NettyServerConfig;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.config.MessageStoreConfig;

/**
 * What differs between the RocketMQ version lines the harness runs. The shared harness
 * ({@code common/}) is compiled once per line, against that line's jars, together with the line's
 * own {@code Line} class ({@code v4/}, {@code v5/}), which implements this interface. Only types
 * whose package is the same in 4.9 and 5.x appear here. The two classes the harness needs whose
 * package moved are named through {@code Line} by empty subclasses: {@code Line.BrokerMessage}
 * ({@code MessageExtBrokerInner}, to build a broker-side message) and {@code Line.RequestCodes}
 * ({@code RequestCode}, for END_TRANSACTION).
 */
interface BrokerLine {
  /** Settings the line's name server has beyond the shared ones (5.x: the bind address). */
  void configureNameServer(NettyServerConfig nameServer);

  /** Settings the line's broker has beyond the shared ones (op batches, timer wheel, bind address). */
  void configureBroker(BrokerConfig broker, MessageStoreConfig store, NettyServerConfig server, long opBatchIntervalMs);

  /** Whatever the check listener needs once it has its broker controller (5.x: its executor). */
  void initCheckListener(DefaultTransactionalMessageCheckListener listener);

  /** True while ends are buffered for an op batch the broker has not written yet (4.9: never). */
  boolean opsBuffered(BrokerController broker);

  /**
   * The queue offset of the i-th message of a store read ({@code decoded} is that message, as
   * {@code MessageDecoder} read it from its commit-log bytes).
   */
  long queueOffset(GetMessageResult result, int i, MessageExt decoded);
}
