"""GPU managed node group with every EFA interface of its instance type, in one AZ and a cluster
placement group (none when its capacity is a reservation, which brings its own placement).

No CDK construct covers EFA node groups, so the launch template is written out: one interface per
entry of the type's layout (``InstanceFacts.network_interfaces``: a single ``efa`` interface, or on
multi-card types the primary ENA interface plus an ``efa-only`` interface per network card, as
AWS's EFA guide lays them out), each carrying the security groups (EKS then adds none of its own,
so the cluster security group is listed explicitly); the launch template names no subnet (the
node group does) and asks for no public IP (EC2 refuses one with several interfaces).
"""

from __future__ import annotations

from aws_cdk import Fn
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from ._private import launch_template, nag
from .layout import ON_DEMAND, GpuCapacity, GpuGroup


class EfaGpuNodeGroup(Construct):
    """One GPU group's nodes in the GPU subnet, each with an EFA interface.

    :param group: the group's instance type, node count (or bounds), ids, labels and tags
        (``layout.GpuGroup``).
    :param cluster: the EKS cluster the nodes join. The concrete ``eks.Cluster``, not ``ICluster``
        (the one exception to the package's rule, as aws-eks-v2's ``[disable-awslint:ref-via-interface]``):
        ``add_nodegroup_capacity`` is the Cluster's, and its node group ids are the deployed ones.
    :param vpc: the cluster's VPC (for the EFA security group).
    :param subnet: the one private subnet of the GPU AZ.
    :param root_volume_gib: encrypted gp3 root volume per node (images, model cache). Default: 200.
    :param capacity: how the nodes are bought (``layout.GpuCapacity``): a reservation is targeted
        by the launch template and gets no placement group of the stack's (a reservation made
        outside it could not be used inside it). Default: ON_DEMAND (on-demand, no reservation).
    :param fast_image_pull: nodeadm's FastImagePull (SOCI's parallel pull and unpack), with the
        root volume's throughput at the 600 MiB/s the AMI's docs recommend while the pull writes to
        it (not with ``local_storage`` on a type with an instance store). Default: False.
    :param local_storage: the instance store's NVMe disks as one RAID0 array under
        /mnt/k8s-disks/0, where containerd and kubelet keep their data (nodeadm's localStorage);
        the node cache lives there. Default: False.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        group: GpuGroup,
        cluster: eks.Cluster,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        root_volume_gib: int = 200,
        capacity: GpuCapacity = ON_DEMAND,
        fast_image_pull: bool = False,
        local_storage: bool = False,
    ) -> None:
        super().__init__(scope, id)
        # EFA traffic must be allowed to and from the group itself; allow_all_outbound already
        # covers the outbound half (CDK rejects a redundant all-traffic egress rule).
        self.security_group = ec2.SecurityGroup(
            self,
            "EfaSecurityGroup",
            vpc=vpc,
            description="EFA: all traffic between GPU nodes",
            allow_all_outbound=True,
        )
        self.security_group.add_ingress_rule(
            self.security_group, ec2.Port.all_traffic(), "EFA and NCCL between GPU nodes"
        )
        self.capacity = capacity
        self.placement_group: ec2.CfnPlacementGroup | None = None
        self.launch_template = self._launch_template(group, cluster, root_volume_gib, fast_image_pull, local_storage)
        self.group = group
        self.nodegroup = cluster.add_nodegroup_capacity(
            group.nodegroup_id,
            # aws-cdk-lib 2.275 checks the AMI type against its own list of GPU families, which
            # stops at g6e and p4de (it calls p5 x86_64 and refuses the NVIDIA AMI): no types here,
            # the one type set on the resource below, where EKS itself checks it.
            instance_types=[],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            launch_template_spec=launch_template.latest(self.launch_template),
            # Autoscaled: the deploy starts the minimum; the Cluster Autoscaler moves the desired
            # size, inside this subnet and placement group, which every later node inherits.
            min_size=group.min_node_count,
            desired_size=group.node_count,
            max_size=group.max_node_count,
            labels=group.node_labels,
            tags=group.node_template_tags or None,
            subnets=ec2.SubnetSelection(subnets=[subnet]),
            capacity_type=_CAPACITY_TYPES.get(capacity.kind),
        )
        cfn_nodegroup = self.nodegroup.node.default_child
        assert isinstance(cfn_nodegroup, eks.CfnNodegroup)
        cfn_nodegroup.add_property_override("InstanceTypes", [group.instance_type])
        if capacity.reserved:
            # EKS's default update launches the new nodes first (surge), which a full reservation
            # refuses; MINIMAL terminates an old node before launching its replacement, one at a
            # time (the EKS API's NodegroupUpdateConfig; aws-cdk-lib exposes no updateStrategy).
            cfn_nodegroup.add_property_override("UpdateConfig", RESERVED_UPDATE_CONFIG)
        nag.acknowledge(self.nodegroup.role, nag.NODE_ROLE)

    def _launch_template(
        self, group: GpuGroup, cluster: eks.Cluster, root_volume_gib: int, fast_image_pull: bool, local_storage: bool
    ) -> ec2.CfnLaunchTemplate:
        """Every EFA interface of the type, IMDSv2, the root volume, the placement (a cluster
        placement group, or the reservation's), the market and nodeadm's configuration."""
        L = ec2.CfnLaunchTemplate
        capacity = self.capacity
        placement = None
        if not capacity.reserved:
            self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            placement = L.PlacementProperty(group_name=self.placement_group.ref)
        reservation = None
        if capacity.reserved:
            target = (
                L.CapacityReservationTargetProperty(capacity_reservation_resource_group_arn=capacity.target)
                if capacity.kind == "odcr-group"
                else L.CapacityReservationTargetProperty(capacity_reservation_id=capacity.target)
            )
            reservation = L.CapacityReservationSpecificationProperty(capacity_reservation_target=target)
        # EC2's launch template for a Capacity Block (the EKS guide's "Capacity Blocks for ML").
        market = (
            L.InstanceMarketOptionsProperty(market_type="capacity-block") if capacity.kind == "capacity-block" else None
        )
        groups = [self.security_group.security_group_id, cluster.cluster_security_group_id]
        user_data = launch_template.node_config(fast_image_pull=fast_image_pull, local_storage=local_storage)
        return L(
            self,
            "LaunchTemplate",
            launch_template_data=L.LaunchTemplateDataProperty(
                network_interfaces=[
                    L.NetworkInterfaceProperty(
                        device_index=interface.device,
                        network_card_index=interface.network_card,
                        interface_type=interface.interface_type,
                        groups=groups,
                        delete_on_termination=True,
                    )
                    for interface in group.instance.network_interfaces
                ],
                metadata_options=launch_template.imds_v2(launch_template.GPU_IMDS_HOP_LIMIT),
                block_device_mappings=[
                    launch_template.root_volume(
                        root_volume_gib,
                        launch_template.root_throughput(
                            fast_image_pull=fast_image_pull,
                            local_storage=local_storage,
                            instance_store_gb=group.instance.instance_store_gb,
                        ),
                    )
                ],
                user_data=Fn.base64(user_data) if user_data else None,
                placement=placement,
                capacity_reservation_specification=reservation,
                instance_market_options=market,
            ),
        )


# How a node group bought from a reservation rolls (AWS::EKS::Nodegroup UpdateConfig).
RESERVED_UPDATE_CONFIG = {"MaxUnavailable": 1, "UpdateStrategy": "MINIMAL"}

# The node group's capacity type per option; on-demand and the ODCR kinds leave EKS's default
# (ON_DEMAND, which an open or targeted reservation serves).
_CAPACITY_TYPES = {"spot": eks.CapacityType.SPOT, "capacity-block": eks.CapacityType.CAPACITY_BLOCK}
